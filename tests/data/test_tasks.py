import json
import random
import re

import pytest

from rlvr.config.schema import DataConfig
from rlvr.data import DatasetError, PromptLoader, RLHFDataset, read_rows, write_parquet
from rlvr.data.prepare import prepare_arithmetic, prepare_countdown, prepare_gsm8k
from rlvr.data.tasks import arithmetic, countdown, gsm8k


def test_evaluate_is_exact_with_precedence():
    assert arithmetic.evaluate("3 + 4 * 5") == 23  # * before +
    assert arithmetic.evaluate("20 - 12 / 4") == 17  # 12 / 4 = 3
    assert arithmetic.evaluate("7 - 9") == -2
    with pytest.raises(ValueError):
        arithmetic.evaluate("__import__('os')")


def test_arithmetic_rows_are_exact_and_in_verl_format():
    spec = arithmetic.ArithmeticSpec(digits=2, operators="+-*/", num_operands=3, max_operand=None)
    rows = arithmetic.make_splits(200, 50, seed=1, spec=spec)
    for row in rows["train"] + rows["test"]:
        expr = row["extra_info"]["expression"]
        assert int(row["reward_model"]["ground_truth"]) == arithmetic.evaluate(expr)
        assert expr in row["prompt"][0]["content"] and row["data_source"] == "arithmetic"
        assert all(0 <= int(n) <= 99 for n in re.findall(r"\d+", expr))
    assert [r["extra_info"]["index"] for r in rows["test"]] == list(range(50))


def test_arithmetic_splits_are_disjoint_and_seeded():
    a = arithmetic.make_splits(300, 100, seed=4)
    b = arithmetic.make_splits(300, 100, seed=4)
    c = arithmetic.make_splits(300, 100, seed=5)
    assert a == b and a != c
    train = {r["extra_info"]["expression"] for r in a["train"]}
    test = {r["extra_info"]["expression"] for r in a["test"]}
    assert len(train) == 300 and len(test) == 100 and not train & test


def test_arithmetic_difficulty_knobs():
    rng = random.Random(0)
    one_digit = arithmetic.ArithmeticSpec(digits=1, operators="+", max_operand=None)
    for _ in range(50):
        expr, value = arithmetic.make_problem(rng, one_digit)
        a, b = map(int, expr.split(" + "))
        assert a <= 9 and b <= 9 and value == a + b
    with pytest.raises(ValueError, match="operators"):
        arithmetic.ArithmeticSpec(operators="+^")
    with pytest.raises(ValueError, match="distinct problems"):
        arithmetic.make_splits(150, 100, spec=one_digit)  # only 100 distinct 1-digit sums


def test_countdown_problems_are_solvable():
    rows = countdown.make_rows(100, seed=0, split="train")
    for row in rows:
        gt = row["reward_model"]["ground_truth"]
        solution = row["extra_info"]["solution"]
        assert arithmetic.evaluate(solution) == gt["target"]
        assert sorted(int(n) for n in re.findall(r"\d+", solution)) == sorted(gt["numbers"])
        assert 3 <= len(gt["numbers"]) <= 4
        assert str(gt["target"]) in row["prompt"][0]["content"]


GSM8K_RAW = [
    {"question": "Natalia sold clips to 48 friends in April, and half as many in May. How many in total?",
     "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn total 48+24 = <<48+24=72>>72.\n#### 72"},
    {"question": "A shop earns $1,234 a day. What does it earn?", "answer": "It earns 1,234.\n#### 1,234"},
    {"question": "The temperature fell from 3 to -5 degrees. What is the change?", "answer": "#### -8"},
]
GSM8K_ZH = [{"question": "...", "answer": "#### 72", "question_zh-cn": "娜塔莉亚四月卖了48个夹子，五月卖了一半。总共卖了多少？",
             "answer_only": "72"}]


def test_gsm8k_from_raw_jsonl_folder(tmp_path):
    src = tmp_path / "grade-school-math" / "data"
    src.mkdir(parents=True)
    (src / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_RAW))
    (src / "test.jsonl").write_text(json.dumps(GSM8K_RAW[0]) + "\n")
    paths = prepare_gsm8k(tmp_path / "out", tmp_path / "grade-school-math")
    train = read_rows(paths["train"])
    assert [r["reward_model"]["ground_truth"] for r in train] == ["72", "1234", "-8"]
    assert train[0]["data_source"] == "openai/gsm8k"
    assert train[0]["prompt"][0]["content"].endswith('output the final answer after "####".')
    assert len(read_rows(paths["test"])) == 1


def test_gsm8k_from_parquet_and_chinese_variant(tmp_path):
    write_parquet(GSM8K_RAW, tmp_path / "hf" / "train-00000-of-00001.parquet")
    assert len(gsm8k.convert(tmp_path / "hf")["train"]) == 3
    (tmp_path / "zh.jsonl").write_text(json.dumps(GSM8K_ZH[0], ensure_ascii=False) + "\n")
    row = gsm8k.convert(tmp_path / "zh.jsonl")["train"][0]
    assert row["reward_model"]["ground_truth"] == "72"
    assert row["prompt"][0]["content"].startswith("娜塔莉亚")


def test_gsm8k_reads_every_shard_and_refuses_two_variants(tmp_path):
    # two shards of one split: both read, in name order (the second shard was dropped silently)
    write_parquet(GSM8K_RAW[:2], tmp_path / "hf" / "main" / "train-00000-of-00002.parquet")
    write_parquet(GSM8K_RAW[2:], tmp_path / "hf" / "main" / "train-00001-of-00002.parquet")
    rows = gsm8k.convert(tmp_path / "hf")["train"]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["72", "1234", "-8"]
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2]
    # the Hugging Face repository's layout: main/ and socratic/; main/ was read because it sorts first
    write_parquet(GSM8K_RAW[:1], tmp_path / "hf" / "socratic" / "train-00000-of-00001.parquet")
    with pytest.raises(DatasetError, match=r"holds train files in 2 folders .*main, .*socratic\): give the one to "
                                           r"read as --src"):
        gsm8k.convert(tmp_path / "hf")
    assert len(gsm8k.convert(tmp_path / "hf" / "main")["train"]) == 3


def test_gsm8k_malformed_rows(tmp_path):
    # a JSONL row is named by its line as an editor counts (the blank line too): the bad row is on
    # line 3; it was called "row 1" (rows from 0, blanks skipped), a line that holds a good row
    good = json.dumps(GSM8K_RAW[0])
    (tmp_path / "train.jsonl").write_text(f"{good}\n\n" + json.dumps({"question": "q", "answer": "no final"}) + "\n")
    with pytest.raises(DatasetError, match=r"train.jsonl, line 3: key 'answer' has no final '#### <number>' line"):
        gsm8k.convert(tmp_path)
    (tmp_path / "train.jsonl").write_text(json.dumps({"answer": "#### 1"}) + "\n")
    with pytest.raises(DatasetError, match="train.jsonl, line 1: key 'question' is missing"):
        gsm8k.convert(tmp_path)
    (tmp_path / "train.jsonl").unlink()  # parquet rows keep their index from 0, as pyarrow and pandas count
    write_parquet([GSM8K_RAW[0], {"question": "q", "answer": None}], tmp_path / "train.parquet")
    with pytest.raises(DatasetError, match="train.parquet, row 1: key 'answer' is missing or not a string"):
        gsm8k.convert(tmp_path)
    with pytest.raises(DatasetError, match="does not exist"):
        gsm8k.convert(tmp_path / "nope")


def test_prepare_arithmetic_feeds_the_trainer_batch(tmp_path, tokenizer):
    """prepare -> parquet -> RLHFDataset -> PromptLoader gives the batch the trainer consumes."""
    paths = prepare_arithmetic(tmp_path, train_size=64, test_size=16, seed=0)
    cfg = DataConfig(train_batch_size=8, max_prompt_length=128)
    loader = PromptLoader(RLHFDataset(paths["train"], tokenizer, cfg), cfg.train_batch_size, seed=cfg.seed)
    batch = next(iter(loader))
    assert len(batch) == 8
    assert set(batch.batch) == {"input_ids", "attention_mask", "position_ids"}
    assert {"raw_prompt_ids", "data_source", "reward_model", "extra_info", "index", "ability"} <= set(
        batch.non_tensor_batch)
    row0 = batch[0]
    ids = row0.batch["input_ids"][0][row0.batch["attention_mask"][0].bool()].tolist()
    assert ids == row0.non_tensor_batch["raw_prompt_ids"][0]
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert row0.non_tensor_batch["extra_info"][0]["expression"] in text
    # the trainer repeats each prompt n times, interleaved, keeping groups adjacent
    assert len(batch.repeat(4, interleave=True)) == 32


def test_prepare_countdown_writes_both_splits(tmp_path):
    paths = prepare_countdown(tmp_path, train_size=20, test_size=5)
    assert len(read_rows(paths["train"])) == 20 and len(read_rows(paths["test"])) == 5
    assert isinstance(read_rows(paths["test"])[0]["reward_model"]["ground_truth"]["numbers"], list)


def test_countdown_splits_are_disjoint_and_without_repeats(tmp_path):
    """Seeded apart with no shared record, 3 of 300 test problems were in train, and train repeated 19."""
    paths = prepare_countdown(tmp_path, train_size=3000, test_size=300)
    key = lambda r: (tuple(sorted(r["reward_model"]["ground_truth"]["numbers"])), r["reward_model"]["ground_truth"]["target"])
    train = [key(r) for r in read_rows(paths["train"])]
    test = [key(r) for r in read_rows(paths["test"])]
    assert len(set(train)) == 3000 and len(set(test)) == 300 and not set(train) & set(test)
