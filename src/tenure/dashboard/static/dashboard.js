// tenure dashboard: live updates by Server-Sent Events, and the countdowns.
// No build step, nothing fetched from elsewhere.
"use strict";

let shownAt = performance.now();

function countdown() {
  const elapsed = performance.now() - shownAt;
  for (const cell of document.querySelectorAll("[data-ttl]")) {
    const left = Math.max(0, Number(cell.dataset.ttl) - elapsed);
    cell.textContent = (left / 1000).toFixed(1) + "s";
    cell.classList.toggle("low", left < 1000);
  }
}

// Brings the nodes of `old` in line with those of `next` in place, so that what
// did not change stays the same node (a link being clicked, a selection).
function morph(old, next) {
  for (const attr of [...old.attributes]) {
    if (!next.hasAttribute(attr.name)) old.removeAttribute(attr.name);
  }
  for (const attr of [...next.attributes]) {
    if (old.getAttribute(attr.name) !== attr.value) old.setAttribute(attr.name, attr.value);
  }
  const mine = old.childNodes;
  const theirs = [...next.childNodes];
  theirs.forEach((node, i) => {
    const here = mine[i];
    if (!here) {
      old.appendChild(node);
    } else if (here.nodeType !== node.nodeType || here.nodeName !== node.nodeName ||
               (node.nodeType === Node.ELEMENT_NODE && here.dataset.key !== node.dataset.key)) {
      old.replaceChild(node, here);
    } else if (node.nodeType === Node.ELEMENT_NODE) {
      morph(here, node);
    } else if (here.nodeValue !== node.nodeValue) {
      here.nodeValue = node.nodeValue;
    }
  });
  while (mine.length > theirs.length) old.removeChild(old.lastChild);
}

function live() {
  const target = document.getElementById("live");
  const status = document.getElementById("live-status");
  if (!target || !target.dataset.events || !window.EventSource) return;
  const source = new EventSource(target.dataset.events);
  source.addEventListener("update", (event) => {
    const next = document.createElement("div");
    next.innerHTML = event.data;
    for (const attr of target.attributes) next.setAttribute(attr.name, attr.value);
    morph(target, next);
    shownAt = performance.now();
    countdown();
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  });
  source.addEventListener("open", () => { if (status) status.textContent = "live"; });
  source.addEventListener("error", () => { if (status) status.textContent = "reconnecting…"; });
}

document.addEventListener("DOMContentLoaded", () => {
  shownAt = performance.now();
  live();
  setInterval(countdown, 100);
});
