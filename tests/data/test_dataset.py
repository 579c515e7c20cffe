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
    assert [o.where for o in ds.origins] == ["line 1", "line 3"]  # origins still point at the file's lines


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_in_dataset(tmp_path, tokenizer, mode):
    write_jsonl(tmp_path / "a.jsonl", [row("word " * 100)])
    ds = RLHFDataset(tmp_path / "a.jsonl", tokenizer,
                     DataConfig(max_prompt_length=32, filter_overlong_prompts=False, truncation=mode))
    full = ds.prompt_ids[0]
    assert ds[0]["raw_prompt_ids"] == truncate_ids(full, 32, mode) and len(ds[0]["raw_prompt_ids"]) == 32


def test_truncation_error_names_file_and_row(tmp_path, tokenizer):
    # refused when the dataset loads, not at the step that first samples the row
    write_jsonl(tmp_path / "a.jsonl", [row(), row("word " * 100)])
    with pytest.raises(DatasetError, match=r"a.jsonl, line 2: prompt has \d+ tokens"):
        RLHFDataset(tmp_path / "a.jsonl", tokenizer, DataConfig(max_prompt_length=48, filter_overlong_prompts=False))
    ds = RLHFDataset(tmp_path / "a.jsonl", tokenizer, DataConfig(max_prompt_length=48, filter_overlong_prompts=False,
                                                                 truncation="left"))
    assert len(ds[1]["raw_prompt_ids"]) == 48


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"data_source": None}, "key 'data_source' is missing"),
        ({"prompt": "What is 1 + 2?"}, "key 'prompt' must be a non-empty list of chat messages"),
        ({"prompt": []}, "key 'prompt' must be a non-empty list"),
        ({"prompt": [{"role": "user", "content": "   "}]}, "key 'prompt' has only empty message contents"),
        ({"prompt": [{"role": "user"}]}, r"key 'prompt\[0\]' must be a dict with string 'role' and 'content'"),
        ({"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "42"}]},
         r"key 'prompt\[1\].role' is 'assistant', the prompt's last message"),
        ({"tools_kwargs": {"calculator": {}}}, "key 'tools_kwargs' is a column of its own.*extra_info.tools_kwargs"),
        ({"extra_info": "oops"}, "key 'extra_info' must be a dict"),
        # a template renders any string as the role: the model would be prompted by 'usr'
        ({"prompt": [{"role": "usr", "content": "hi"}]}, r"key 'prompt\[0\].role' is 'usr', not a chat role "
                                                           r".*; did you mean 'user'\?"),
    ],
)
def test_malformed_row_names_file_row_and_key(tmp_path, tokenizer, bad, message):
    write_jsonl(tmp_path / "a.jsonl", [row(), row(**bad)])
    with pytest.raises(DatasetError, match=r"a.jsonl, line 2: " + message):
        RLHFDataset(tmp_path / "a.jsonl", tokenizer)


def test_missing_prompt_key(tmp_path, tokenizer):
    bad = row()
    del bad["prompt"]
    write_jsonl(tmp_path / "a.jsonl", [bad])
    with pytest.raises(DatasetError, match=r"line 1: key 'prompt' is missing \(the row has"):
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


def test_jsonl_rows_are_named_by_their_line_as_an_editor_counts(tmp_path, tokenizer):
    """A blank line counts: the bad row on line 4 was called "row 2" (rows from 0, blanks skipped)."""
    good = json.dumps(row())
    (tmp_path / "a.jsonl").write_text(f"{good}\n\n{good}\n{json.dumps(row(prompt=[{'role': 'usr', 'content': 'x'}]))}\n")
    with pytest.raises(DatasetError, match=r"a.jsonl, line 4: key 'prompt\[0\].role'"):
        RLHFDataset(tmp_path / "a.jsonl", tokenizer)


def test_a_folder_or_a_pretty_printed_json_file_is_named_for_what_it_is(tmp_path, tokenizer):
    (tmp_path / "data").mkdir()
    with pytest.raises(DatasetError, match=r"'.*data' is a folder; give the file itself"):
        RLHFDataset(tmp_path / "data", tokenizer)
    # a folder of shards (a Hugging Face download): every shard is named, so that none is left out
    for shard in ("train-00001-of-00002.parquet", "train-00000-of-00002.parquet"):
        write_parquet([row()], tmp_path / "data" / "train" / shard)
    (tmp_path / "data" / "README.md").write_text("not data")
    with pytest.raises(DatasetError, match=r"is a folder of 2 dataset files; list them all: data.train_files=\['.*"
                                           r"train-00000-of-00002.parquet', '.*train-00001-of-00002.parquet'\]"):
        RLHFDataset(tmp_path / "data", tokenizer)
    (tmp_path / "a.json").write_text(json.dumps(row(), indent=2))
    with pytest.raises(DatasetError, match=r"line 1 is not valid JSON .*one whole JSON object per line"):
        RLHFDataset(tmp_path / "a.json", tokenizer)


def test_a_template_that_refuses_a_row_is_named_with_its_row(tmp_path, tokenizer):
    """A chat template's own refusal (jinja's raise_exception, as Gemma's for a system turn) and a
    tokenizer without a template were bare tracebacks naming neither the file nor the row."""
    import copy

    strict = copy.copy(tokenizer)
    strict.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
                            "{{ raise_exception('System must be first') }}{% endif %}{{ m['content'] }}{% endfor %}")
    write_jsonl(tmp_path / "a.jsonl", [row(), row(prompt=[{"role": "user", "content": "hi"},
                                                          {"role": "system", "content": "late"},
                                                          {"role": "user", "content": "again"}])])
    with pytest.raises(DatasetError, match=r"a.jsonl, line 2: key 'prompt' could not be rendered.*System must be first"):
        RLHFDataset(tmp_path / "a.jsonl", strict)
    bare = copy.copy(tokenizer)
    bare.chat_template = None
    with pytest.raises(DatasetError, match=r"line 1: .*no chat template.*data.apply_chat_template=false"):
        RLHFDataset(tmp_path / "a.jsonl", bare)
    assert len(RLHFDataset(tmp_path / "a.jsonl", bare, DataConfig(apply_chat_template=False))) == 2
