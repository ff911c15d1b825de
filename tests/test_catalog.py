"""The shipped catalog: every figure sourced and converted; lookups name the closest kinds."""

import pytest

from pipeplan.models.errors import InputError
from pipeplan.solver.formats.catalog import load_catalog

#: What issue 28 asks the catalog to hold at least.
REQUIRED_ACCELERATORS = ("h100-sxm", "h100-pcie", "h200", "a100-40g", "a100-80g", "a100-pcie-40g", "a100-pcie-80g",
                         "l40s", "l4", "a10", "v100-16g", "v100-32g", "t4", "rtx4090", "mi250x", "mi300x")
REQUIRED_LINKS = ("nvlink2", "nvlink3", "nvlink4", "pcie3", "pcie4", "pcie5", "ib-hdr", "ib-ndr",
                  "100gbe", "200gbe", "400gbe")


class TestLoadCatalog:
    def test_holds_the_kinds_asked_for(self):
        catalog = load_catalog()
        assert set(REQUIRED_ACCELERATORS) <= set(catalog.accelerators)
        assert set(REQUIRED_LINKS) <= set(catalog.links)

    def test_every_entry_names_its_source(self):
        catalog = load_catalog()
        for entry in (*catalog.accelerators.values(), *catalog.links.values()):
            assert len(entry.source) > 20, entry.id

    def test_figures_in_the_cluster_formats_units(self):
        catalog = load_catalog()
        a100 = catalog.accelerators["a100-80g"]
        assert (a100.memory, a100.flops, a100.memory_bandwidth) == (80 * 2**30, 312e12, 2039e9)
        assert catalog.links["ib-hdr"].bandwidth == 2.5e10  # 200 Gb/s, one way
        assert catalog.links["nvlink3"].bandwidth == 3e11  # 600 GB/s both ways summed
        assert catalog.links["pcie3"].bandwidth == 1.6e10
        assert catalog.links["400gbe"].bandwidth == 5e10

    def test_dense_not_sparse_flops(self):
        # the data sheets print the sparse figure first for these: dense is half of it
        catalog = load_catalog()
        assert catalog.accelerators["h100-sxm"].flops == pytest.approx(1979e12 / 2, rel=1e-3)
        assert catalog.accelerators["l4"].flops == 242e12 / 2

    def test_every_figure_is_positive_and_links_resolve(self):
        catalog = load_catalog()
        for a in catalog.accelerators.values():
            assert a.memory > 0 and a.flops > 0 and a.memory_bandwidth > 0
            assert a.link in catalog.links and a.pcie in catalog.links
        for k in catalog.links.values():
            assert k.bandwidth > 0 and k.latency > 0


class TestAccelerator:
    def test_unknown_kind_names_the_closest(self):
        with pytest.raises(InputError) as info:
            load_catalog().accelerator("a100-80gb", "--server")
        assert info.value.where == "--server" and "closest: a100-80g" in info.value.what

    def test_known_kind(self):
        assert load_catalog().accelerator("t4").name == "NVIDIA Tesla T4 16GB"


class TestLink:
    def test_a_server_link_is_no_network(self):
        with pytest.raises(InputError) as info:
            load_catalog().link("nvlink3", "network")
        assert "is a server link" in info.value.what and "ib-hdr" in info.value.what

    def test_unknown_link_names_the_closest(self):
        with pytest.raises(InputError) as info:
            load_catalog().link("ib-hrd", "network")
        assert "closest: ib-hdr" in info.value.what

    def test_loopback_serves_both(self):
        catalog = load_catalog()
        assert catalog.link("loopback", "server") is catalog.link("loopback", "network")


class TestMatchDeviceName:
    @pytest.mark.parametrize("name, kind", [
        ("NVIDIA A100-SXM4-80GB", "a100-80g"), ("nvidia  h200", "h200"), ("Tesla V100-PCIE-32GB", "v100-pcie-32g"),
        ("NVIDIA L4", "l4"), ("NVIDIA L40S", "l40s"),
    ])
    def test_torch_names_find_their_kind(self, name, kind):
        assert load_catalog().match_device_name(name).id == kind

    def test_an_unknown_name_finds_none(self):
        assert load_catalog().match_device_name("NVIDIA GeForce GTX 1080") is None
