"""How `Server.start` is configured, without starting a server: ServerSettings against conf/start.yaml, the
keyword overrides, the ports it picks and the tritonserver command line it builds (the real server runs in
tests/test_serve.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from serve.launch import ADMIN_KEY_FILE, triton_command, write_admin_key
from serve.server import Server, ServerError
from serve.server_settings import ServerSettings, pick_ports
from serve.start import settings_from
from zoo.entries import CONF_DIR


def test_start_yaml_defaults_are_the_settings_defaults() -> None:
    """The command's defaults and the library's agree, so a setting documented on ServerSettings holds for both."""
    assert settings_from(OmegaConf.load(CONF_DIR / "start.yaml")) == ServerSettings()
    no_proxy = OmegaConf.merge(OmegaConf.load(CONF_DIR / "start.yaml"), {"proxy": False, "max_body_mb": 8})
    assert settings_from(no_proxy).proxy is None


def test_an_unknown_override_fails_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="http_prot"):
        Server.start(tmp_path / "no-repo", http_prot=0)
    assert not (tmp_path / "no-repo.serve").exists()


def test_pick_ports_fills_zeros_and_moves_triton_behind_the_proxy() -> None:
    any_port = ServerSettings(http_port=0, grpc_port=0, metrics_port=0)
    proxied = pick_ports(any_port)
    assert len(proxied.tritons) == 2  # two tritonservers behind the gate by default
    listed = [proxied.http, proxied.grpc, proxied.metrics, proxied.gate_http, proxied.gate_grpc, proxied.gate_metrics]
    listed += [port for t in proxied.tritons for port in (t.http, t.grpc, t.metrics)]
    assert all(listed) and len(set(listed)) == 12
    direct = pick_ports(ServerSettings(http_port=0, grpc_port=0, metrics_port=0, proxy=None, replicas=1))
    assert [(t.http, t.grpc, t.metrics) for t in direct.tritons] == [(direct.http, direct.grpc, direct.metrics)]
    without_metrics = pick_ports(ServerSettings(http_port=0, grpc_port=0, metrics_port=0, metrics=False))
    assert {t.metrics for t in without_metrics.tritons} == {without_metrics.metrics}  # no port for a listener off
    assert len(pick_ports(ServerSettings(http_port=0, grpc_port=0, metrics_port=0, proxy=None)).tritons) == 1
    with pytest.raises(ServerError, match=r"replicas=2.*behind the gate.*replicas=1"):
        pick_ports(ServerSettings(http_port=0, grpc_port=0, metrics_port=0, proxy=None, replicas=2))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServerError, match=f"port {port} \\(grpc_port\\).*busy"):
            pick_ports(ServerSettings(http_port=0, grpc_port=port, metrics_port=0))


def test_triton_command_listens_behind_the_proxy_and_restricts(tmp_path: Path) -> None:
    pytest.importorskip("pytriton")
    settings = ServerSettings(host="0.0.0.0", http_port=0, grpc_port=0, metrics_port=0, extra_args=("--x=1",))
    ports = pick_ports(settings).tritons[1]
    key = write_admin_key(tmp_path)
    cmd = triton_command(tmp_path / "repo", tmp_path, settings, ports, "zoo_triton_test_", key)
    assert "--http-address=127.0.0.1" in cmd and f"--http-port={ports.http}" in cmd
    assert "--metrics-address=127.0.0.1" in cmd and f"--grpc-port={ports.grpc}" in cmd
    assert "--grpc-address=127.0.0.1" in cmd  # issue 40: gRPC behind nginx too (its message size is capped there)
    assert any(a.startswith("--http-restricted-api=") and a.endswith(key) for a in cmd)
    assert (tmp_path / ADMIN_KEY_FILE).read_text().strip() == key
    assert cmd[-1] == "--x=1"
    direct = ServerSettings(host="0.0.0.0", restrict=False, proxy=None, replicas=1)
    open_cmd = triton_command(tmp_path / "repo", tmp_path, direct, pick_ports(direct).tritons[0], "zoo_t_", None)
    assert "--http-address=0.0.0.0" in open_cmd and "--metrics-address=0.0.0.0" in open_cmd
    assert "--grpc-address=0.0.0.0" in open_cmd
    assert not any("restricted" in a for a in open_cmd)
