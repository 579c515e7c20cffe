import json

import pytest
import torch

from rlvr.config.schema import DataConfig
from rlvr.data import DatasetError, PromptLoader, RLHFDataset, left_pad, truncate_ids, write_parquet
from rlvr.protocol import DataProto


def row(content="What is 1 + 2?", i=0, **extra):
    r = {"data_source": "arithmetic", "prompt": [{"role": "user", "content": content}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "3"}, "extra_info": {"index": i, "split": "train"}}
    r.update(extra)
    return r


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_truncation_modes():
    ids = list(range(10))
    assert truncate_ids(ids, 4, "left") == [6, 7, 8, 9]
    assert truncate_ids(ids, 4, "right") == [0, 1, 2, 3]
    assert truncate_ids(ids, 5, "middle") == [0, 1, 7, 8, 9]  # head 5//2 = 2, tail 3
    assert truncate_ids(ids, 10, "error") == ids
    with pytest.raises(DatasetError, match="prompt has 10 tokens, more than data.max_prompt_length=4"):
        truncate_ids(ids, 4, "error")


def test_left_pad_masks_and_positions():
    input_ids, mask, pos = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert input_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]


def test_dataset_from_parquet_and_jsonl(tmp_path, tokenizer):
    write_parquet([row(i=0), row("What is 10 * 3?", i=1)], tmp_path / "a.parquet")
    write_jsonl(tmp_path / "b.jsonl", [row("What is 4 - 4?", i=7)])
    ds = RLHFDataset([tmp_path / "a.parquet", tmp_path / "b.jsonl"], tokenizer, DataConfig(max_prompt_length=128))
    assert len(ds) == 3
    item = ds[2]
    text = tokenizer.apply_chat_template(row("What is 4 - 4?")["prompt"], add_generation_prompt=True, tokenize=False)
    assert item["raw_prompt_ids"] == tokenizer.encode(text, add_special_tokens=False)
    assert item["index"] == 7 and item["data_source"] == "arithmetic"
    assert item["reward_model"]["ground_truth"] == "3"
    assert "raw_prompt" not in item and "prompt" not in item


def test_return_raw_chat(tmp_path, tokenizer):
    write_jsonl(tmp_path / "a.jsonl", [row()])
    ds = RLHFDataset(tmp_path / "a.jsonl", tokenizer, DataConfig(return_raw_chat=True))
    assert ds[0]["raw_prompt"] == row()["prompt"]


def test_collate_left_pads_to_batch_longest(tmp_path, tokenizer):
    write_jsonl(tmp_path / "a.jsonl", [row("Hi"), row("What is 12345 + 67890 and then times three?")])
    ds = RLHFDataset(tmp_path / "a.jsonl", tokenizer)
    batch = ds.collate([ds[0], ds[1]])
    assert isinstance(batch, DataProto)
    short, long = (len(ds[i]["raw_prompt_ids"]) for i in range(2))
    assert batch.batch["input_ids"].shape == (2, long)
    assert batch.batch["attention_mask"][0].tolist() == [0] * (long - short) + [1] * short
    assert batch.batch["input_ids"][0, :long - short].eq(tokenizer.pad_token_id).all()
    assert batch.batch["position_ids"][0, -1] == short - 1
    assert batch.non_tensor_batch["raw_prompt_ids"][0] == ds[0]["raw_prompt_ids"]
    assert batch.non_tensor_batch["data_source"].tolist() == ["arithmetic"] * 2


def test_filter_overlong_prompts(tmp_path, tokenizer):
    write_jsonl(tmp_path / "a.jsonl", [row("short"), row("long " * 200), row("also short")])
    ds = RLHFDataset(tmp_path / "a.jsonl", tokenizer, DataConfig(max_prompt_length=64))
    assert len(ds) == 2 and ds.num_filtered == 1
    assert [o.row for o in ds.origins] == [0, 2]  # origins still point at the file's rows


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_in_dataset(tmp_path, tokenizer, mode):
    write_jsonl(tmp_path / "a.jsonl", [row("word " * 100)])
    ds = RLHFDataset(tmp_path / "a.jsonl", tokenizer,
                     DataConfig(max_prompt_length=32, filter_overlong_prompts=False, truncation=mode))
    full = ds.prompt_ids[0]
    assert ds[0]["raw_prompt_ids"] == truncate_ids(full, 32, mode) and len(ds[0]["raw_prompt_ids"]) == 32


def test_truncation_error_names_file_and_row(tmp_path, tokenizer):
    write_jsonl(tmp_path / "a.jsonl", [row(), row("word " * 100)])
    ds = RLHFDataset(tmp_path / "a.jsonl", tokenizer, DataConfig(max_prompt_length=32, filter_overlong_prompts=False))
    with pytest.raises(DatasetError, match=r"a.jsonl, row 1: prompt has \d+ tokens"):
        ds[1]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"data_source": None}, "key 'data_source' is missing"),
        ({"prompt": "What is 1 + 2?"}, "key 'prompt' must be a non-empty list of chat messages"),
        ({"prompt": []}, "key 'prompt' must be a non-empty list"),
        ({"prompt": [{"role": "user", "content": "   "}]}, "key 'prompt' has only empty message contents"),
        ({"prompt": [{"role": "user"}]}, r"key 'prompt\[0\]' must be a dict with string 'role' and 'content'"),
        ({"reward_model": {"style": "rule"}}, "key 'reward_model.ground_truth' is missing"),
        ({"extra_info": "oops"}, "key 'extra_info' must be a dict"),
        # a template renders any string as the role: the model would be prompted by 'usr'
        ({"prompt": [{"role": "usr", "content": "hi"}]}, r"key 'prompt\[0\].role' is 'usr', not a chat role "
                                                           r".*; did you mean 'user'\?"),
    ],
)
def test_malformed_row_names_file_row_and_key(tmp_path, tokenizer, bad, message):
    write_jsonl(tmp_path / "a.jsonl", [row(), row(**bad)])
    with pytest.raises(DatasetError, match=r"a.jsonl, row 1: " + message):
        RLHFDataset(tmp_path / "a.jsonl", tokenizer)


def test_missing_prompt_key(tmp_path, tokenizer):
    bad = row()
    del bad["prompt"]
    write_jsonl(tmp_path / "a.jsonl", [bad])
    with pytest.raises(DatasetError, match=r"row 0: key 'prompt' is missing \(the row has"):
        RLHFDataset(tmp_path / "a.jsonl", tokenizer)


def test_bad_files(tmp_path, tokenizer):
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{not json\n')
    with pytest.raises(DatasetError, match="bad.jsonl: line 2 is not valid JSON"):
        RLHFDataset(tmp_path / "bad.jsonl", tokenizer)
    with pytest.raises(DatasetError, match="does not exist; create it with `rlvr prepare arithmetic`"):
        RLHFDataset(tmp_path / "arithmetic" / "train.parquet", tokenizer)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match="suffix '.csv'"):
        RLHFDataset(tmp_path / "x.csv", tokenizer)
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(DatasetError, match="not a readable parquet file"):
        RLHFDataset(tmp_path / "x.parquet", tokenizer)


def test_prompt_loader_yields_dataproto_batches(tmp_path, tokenizer):
    write_jsonl(tmp_path / "a.jsonl", [row(f"What is {i} + 1?", i=i) for i in range(10)])
    loader = PromptLoader(RLHFDataset(tmp_path / "a.jsonl", tokenizer), batch_size=4, shuffle=True, seed=3)
    batches = list(loader)
    assert len(loader) == 2 and len(batches) == 2  # 10 rows, batches of 4, last 2 dropped
    seen = [i for b in batches for i in b.non_tensor_batch["index"].tolist()]
    assert len(set(seen)) == 8
    assert all(b.batch["input_ids"].dtype == torch.long for b in batches)
