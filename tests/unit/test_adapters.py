import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from lora_serving.adapters.catalog import AdapterCatalog, check_adapter_name, pick_adapter_name
from lora_serving.errors import ConfigError, InvalidRequest, UnknownAdapter


def make_adapter(folder, rank=8, modules=("model.decoder.layers.0.fc1",), bin_weights=False):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 16, "target_modules": ["fc1"]})
    )
    tensors = {}
    for module in modules:
        tensors[f"base_model.model.{module}.lora_A.weight"] = np.zeros((rank, 4), np.float32)
        tensors[f"base_model.model.{module}.lora_B.weight"] = np.ones((4, rank), np.float32)
    if bin_weights:
        (folder / "adapter_model.bin").write_bytes(b"pickle")
    else:
        save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def catalog_from(tmp_path, entries, **kwargs):
    path = tmp_path / "multi_lora.json"
    path.write_text(json.dumps(entries))
    return AdapterCatalog.from_multi_lora_json(
        path, enabled=True, max_lora_rank=kwargs.pop("max_lora_rank", 16), **kwargs
    )


def test_ids_follow_file_order_and_paths_are_relative_to_the_file(tmp_path):
    make_adapter(tmp_path / "ads" / "b")
    make_adapter(tmp_path / "ads" / "a")
    catalog = catalog_from(tmp_path, {"b": "ads/b", "a": "ads/a"})
    assert catalog.names == ["b", "a"]
    assert [adapter.int_id for adapter in catalog] == [1, 2]
    assert catalog.resolve("a").path == (tmp_path / "ads" / "a").resolve()
    assert catalog.resolve("a").rank == 8
    assert catalog.resolve(None) is None and catalog.resolve("") is None


def test_unknown_adapter_lists_the_available_ones(tmp_path):
    make_adapter(tmp_path / "x")
    make_adapter(tmp_path / "y")
    catalog = catalog_from(tmp_path, {"y": "y", "x": "x"})
    with pytest.raises(UnknownAdapter, match=r"unknown adapter 'z'; available: x, y"):
        catalog.resolve("z")


def test_lora_disabled_but_adapter_requested():
    catalog = AdapterCatalog.from_multi_lora_json(None, enabled=False, max_lora_rank=8)
    with pytest.raises(InvalidRequest, match="LoRA is disabled"):
        catalog.resolve("a")


def test_every_bad_adapter_is_refused_with_its_reasons(tmp_path):
    make_adapter(tmp_path / "big", rank=64)
    make_adapter(tmp_path / "pickled", bin_weights=True)
    make_adapter(tmp_path / "encoder", modules=("model.encoder.layers.0.fc1",))
    with pytest.raises(ConfigError) as err:
        catalog_from(
            tmp_path,
            {
                "big": "big",
                "pickled": "pickled",
                "gone": "missing",
                "encoder": "encoder",
                "../evil": "big",
            },
            module_check=lambda modules: [f"refused {sorted(modules)}"]
            if any("encoder" in m for m in modules)
            else [],
        )
    text = str(err.value)
    assert "rank 64 exceeds max_lora_rank 16" in text
    assert "adapter_model.bin (pickle) refused" in text
    assert "missing does not exist" in text
    assert "refused ['base_model.model.model.encoder.layers.0.fc1']" in text
    assert "invalid adapter name ../evil" in text


@pytest.mark.parametrize(
    "name", ["../x", "/abs", "a/b", "a\x00b", "x" * 65, "", ".hidden", "tab\tname", "a..b"]
)
def test_names_must_be_plain_identifiers(name):
    with pytest.raises(InvalidRequest, match="invalid adapter name"):
        check_adapter_name(name)


@pytest.mark.parametrize("name", ["alpha", "A1", "my-adapter_v2.1"])
def test_plain_names_pass(name):
    check_adapter_name(name)


def test_pick_adapter_name():
    assert pick_adapter_name(("p", None), ("t", "a"), ("j", None)) == "a"
    assert pick_adapter_name(("p", "a"), ("t", "a")) == "a"
    assert pick_adapter_name(("p", None), ("t", "")) is None
    with pytest.raises(InvalidRequest, match="conflicting adapter names: p='a', t='b'"):
        pick_adapter_name(("p", "a"), ("t", "b"))
