"""nginx's error log with repeated messages collapsed: the gate (serve/gate.py) receives nginx's log as syslog on a
loopback UDP port and writes it to nginx's error.log through `CollapsingLog`.

Why: a client can make nginx write a line per request — a headers-only request over the body cap is answered 413
and logged at 187 B, about 5 300 times a second from one client (issue 61) — and nginx has no rate limit for its
error log. Messages are grouped by their text with what a client varies removed (the connection number, the
client's address, the request line and host, every number): the first `burst` of a group in a `window_s` are
written as they come, the rest only counted, and one line per group says how many were left out when its window
ends. So a flood of one kind costs a few lines a minute; a new kind of message is always written at once.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

BURST = 5  # lines of one group written per window as they come
WINDOW_S = 60.0
MAX_GROUPS = 1000  # groups tracked at once; beyond it the oldest windows are closed early
SYSLOG_HEADER = re.compile(rb"^<\d+>(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d )?(?:\S+: )?")
CLIENT_PARTS = re.compile(r'\*\d+ |, (client|server|request|upstream|host|referrer): ("[^"]*"|[^,]*)')
NUMBERS = re.compile(r"\d+")


@dataclass
class _Group:
    opened: float
    written: int = 0
    left_out: int = 0
    example: str = ""


@dataclass
class CollapsingLog:
    """Writes messages to `path` (appending: the supervisor rotates it by size) with repeats collapsed."""

    path: Path
    burst: int = BURST
    window_s: float = WINDOW_S
    groups: dict[str, _Group] = field(default_factory=dict)

    @staticmethod
    def group_of(message: str) -> str:
        """'2026/11/29 03:04:17 [error] 12#12: *3 client intended to send too large body: 9 bytes, client: 1.2.3.4,
        …' → '[error] N#N: client intended to send too large body: N bytes' (what a client cannot vary)."""
        text = message[message.find("[") :] if "[" in message else message  # from the level on: no timestamp
        return NUMBERS.sub("N", CLIENT_PARTS.sub("", text))

    def write(self, message: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.close_windows(now)
        key = self.group_of(message)
        group = self.groups.get(key)
        if group is None:
            if len(self.groups) >= MAX_GROUPS:
                self.close_windows(now, oldest=len(self.groups) - MAX_GROUPS + 1)
            group = self.groups[key] = _Group(opened=now)
        if group.written < self.burst:
            group.written += 1
            self._append([message])
        else:
            group.left_out += 1
            group.example = message

    def close_windows(self, now: float, oldest: int = 0) -> None:
        """End the windows older than `window_s` (and the `oldest` n others): one summary line per group that
        left messages out."""
        ended = [k for k, g in self.groups.items() if now - g.opened >= self.window_s]
        if oldest:
            ended += [k for k in sorted(self.groups, key=lambda k: self.groups[k].opened) if k not in ended][:oldest]
        lines = []
        for key in ended:
            group = self.groups.pop(key)
            if group.left_out:
                lines.append(
                    f"{time.strftime('%Y/%m/%d %H:%M:%S')} [notice] zoo-gate: {group.left_out} more like the "
                    f"following in {now - group.opened:.0f} s left out of this log (rate limit {self.burst} per "
                    f"{self.window_s:.0f} s); the last: {group.example}"
                )
        if lines:
            self._append(lines)

    def close_all(self) -> None:
        """End every window now (the gate is stopping): the counts of what was left out are written."""
        self.close_windows(time.monotonic(), oldest=len(self.groups))

    def _append(self, lines: list[str]) -> None:
        with self.path.open("a", encoding="utf-8", errors="replace") as fh:
            fh.write("".join(line.rstrip("\n") + "\n" for line in lines))


class SyslogReceiver(asyncio.DatagramProtocol):
    """nginx's `error_log syslog:server=127.0.0.1:<port>,nohostname,tag=nginx`: one message per datagram."""

    def __init__(self, log: CollapsingLog) -> None:
        self.log = log

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.log.write(SYSLOG_HEADER.sub(b"", data[:8192]).decode("utf-8", "replace"))


async def receive_syslog(port: int, path: Path) -> tuple[asyncio.DatagramTransport, CollapsingLog]:
    """Listen on loopback UDP `port`; returns the transport (close it to stop) and the log (its windows are closed
    by the caller's periodic `close_windows`, so a summary is written even when the flood stops)."""
    log = CollapsingLog(path)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: SyslogReceiver(log), local_addr=("127.0.0.1", port))
    return transport, log


__all__ = ["BURST", "WINDOW_S", "CollapsingLog", "SyslogReceiver", "receive_syslog"]
