"""What ``tenure doctor`` checks on an etcd cluster (see :mod:`tenure._doctor`).

It reads the cluster's status, members and alarms through the backend's own
channel and writes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..._doctor import Finding, ok, unsafe, warn
from ._connection import rpc

if TYPE_CHECKING:
    from ._leases import EtcdLeases

__all__ = ["diagnose"]


async def diagnose(backend: EtcdLeases) -> list[Finding]:
    link = backend._ch
    maintenance = link.stub(rpc.MaintenanceStub)
    cluster = link.stub(rpc.ClusterStub)
    status = await backend._call("tenure doctor", maintenance.Status, rpc.StatusRequest())
    members = await backend._call("tenure doctor", cluster.MemberList, rpc.MemberListRequest())
    alarms = await backend._call(
        "tenure doctor",
        maintenance.Alarm,
        rpc.AlarmRequest(action=rpc.AlarmRequest.AlarmAction.GET),
    )
    findings = [
        ok(
            "server",
            f"etcd {status.version} at {link.where}, raft term {status.raftTerm}, "
            f"database {status.dbSize // 1024} KiB",
        )
    ]
    if status.leader == 0:
        findings.append(
            unsafe("leader", "the member that answered knows no leader", "check the cluster")
        )
    voters = [m for m in members.members if not m.isLearner]
    if len(voters) < 3:
        findings.append(
            warn(
                "members",
                f"{len(voters)} voting member(s): losing one stops every lease operation",
                "run 3 or 5 members",
            )
        )
    elif len(voters) % 2 == 0:
        findings.append(
            warn(
                "members",
                f"{len(voters)} voting members: an even number tolerates no more failures "
                f"than {len(voters) - 1}",
                "run an odd number of members",
            )
        )
    else:
        findings.append(ok("members", f"{len(voters)} voting members: {len(voters) // 2} may fail"))
    listed: set[tuple[str, int | None]] = {(host.lower(), port) for host, port in link.endpoints}
    missing = [m for m in members.members if not _listed(m.clientURLs, listed)]
    if missing:
        findings.append(
            warn(
                "endpoints",
                f"the URL lists {len(members.members) - len(missing)} of "
                f"{len(members.members)} members: calls cannot go to the others when those "
                "listed fail",
                "list every member in the etcd:// URL",
            )
        )
    raised = [rpc.AlarmType.Name(a.alarm) for a in alarms.alarms if a.alarm != rpc.AlarmType.NONE]
    if raised:
        findings.append(
            unsafe(
                "alarms",
                f"raised: {', '.join(sorted(set(raised)))} (etcd refuses writes)",
                "free space or repair the member, then etcdctl alarm disarm",
            )
        )
    else:
        findings.append(ok("alarms", "none raised"))
    findings.append(
        ok(
            "clock",
            "lease deadlines use the clients' wall clocks: keep every client in NTP sync",
        )
    )
    return findings


def _listed(urls: list[str], listed: set[tuple[str, int | None]]) -> bool:
    return any(((u.hostname or "").lower(), u.port) in listed for u in map(urlsplit, urls))
