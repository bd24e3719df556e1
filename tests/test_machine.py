"""What a measurement records about its machine: enough to keep timings of different CPUs apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo.machine import cpu_signature, describe_machine, machine_class


def test_same_cpu_name_with_another_family_or_isa_is_another_machine_class() -> None:
    """ "AMD EPYC" names a Zen 3 (AVX2) and a Zen 5 (AVX-512): their timings must not share a table. Records made
    before the signature was recorded keep their class; an accelerator's name decides alone."""
    zen3 = {"cpu_model": "AMD EPYC", "cpu_signature": "family 25 model 1, AVX2"}
    zen5 = {"cpu_model": "AMD EPYC", "cpu_signature": "family 26 model 2, AVX-512"}
    assert machine_class(zen3) != machine_class(zen5)
    assert machine_class(zen5) == "cpu:AMD EPYC (family 26 model 2, AVX-512)"
    assert machine_class({"cpu_model": "AMD EPYC"}) == "cpu:AMD EPYC"
    assert machine_class({**zen5, "accelerator": "NVIDIA H200"}) == "gpu:NVIDIA H200"


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="no /proc/cpuinfo on this system")
def test_this_machines_signature_is_read_from_cpuinfo() -> None:
    """The first processor's family and model, and the widest of AMX / AVX-512 / AVX2 its flags list."""
    block = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    fields = dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in block.splitlines()))
    flags = set(fields["flags"].split())
    isa = (
        "AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    )
    expected = f"family {fields['cpu family']} model {fields['model']}, {isa}"
    assert cpu_signature() == expected
    info = describe_machine()
    assert info["cpu_signature"] == expected and info["class"].endswith(f"({expected})")
