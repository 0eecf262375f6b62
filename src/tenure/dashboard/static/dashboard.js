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

function live() {
  const target = document.getElementById("live");
  const status = document.getElementById("live-status");
  if (!target || !target.dataset.events || !window.EventSource) return;
  const source = new EventSource(target.dataset.events);
  source.addEventListener("update", (event) => {
    target.innerHTML = event.data;
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
