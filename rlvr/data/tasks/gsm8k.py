"""GSM8K from its raw files into verl's row format (no data ships with rlvr).

Reads the original layout (``train.jsonl`` / ``test.jsonl`` with ``question`` and an
``answer`` whose last line is ``#### 72``), the Hugging Face parquet export of the same
columns, and the Chinese variant (``question_zh-cn`` and ``answer_only``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlvr.data.io import DatasetError, SUFFIXES, read_numbered_rows

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
# named system prompts for ``rlvr prepare gsm8k --system-prompt NAME`` (any other value is used as is):
# the reasoning/answer format that seed 002's rewards (rlvr.rewards.scorers.format) check
SYSTEM_PROMPTS = {
    "think-answer": "Answer in this format:\n<think>\nyour reasoning\n</think>\n<answer>\nthe final number only\n</answer>",
    "think-answer-zh": "请按以下格式作答：\n<think>\n推理过程\n</think>\n<answer>\n最终答案（只写数字）\n</answer>",
}


def final_answer(answer: str) -> str | None:
    """The number after the last ``####``, without thousands separators."""
    if "####" not in answer:
        return None
    return answer.rsplit("####", 1)[1].strip().replace(",", "").rstrip(".") or None


def convert_row(row: dict[str, Any], index: int, split: str, origin: str,
                system_prompt: str | None = None) -> dict[str, Any]:
    """One raw row in verl's format; ``origin`` names it in errors ("train.jsonl, line 4"). With
    ``system_prompt`` the question goes bare after a system message (the answer format is the
    system prompt's business); without, the "####" instruction follows the question."""
    if "question_zh-cn" in row:  # Chinese GSM8K: translated question, bare answer
        question, key = row["question_zh-cn"], "question_zh-cn"
        ground_truth = str(row.get("answer_only", "")).strip().replace(",", "") or None
        if ground_truth is None:
            raise DatasetError(f"{origin}: key 'answer_only' is missing or empty")
        solution = row.get("answer")
    else:
        question, key = row.get("question"), "question"
        if not isinstance(row.get("answer"), str):
            raise DatasetError(f"{origin}: key 'answer' is missing or not a string")
        ground_truth, solution = final_answer(row["answer"]), row["answer"]
        if ground_truth is None:
            raise DatasetError(f"{origin}: key 'answer' has no final '#### <number>' line")
    if not isinstance(question, str) or not question.strip():
        raise DatasetError(f"{origin}: key {key!r} is missing or empty")
    return {
        "data_source": DATA_SOURCE,
        "prompt": ([{"role": "system", "content": SYSTEM_PROMPTS.get(system_prompt, system_prompt)},
                    {"role": "user", "content": question.strip()}] if system_prompt
                   else [{"role": "user", "content": f"{question.strip()} {INSTRUCTION}"}]),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index, "split": split, "question": question, "answer": solution},
    }


def find_split_files(src: Path) -> dict[str, list[Path]]:
    """``{'train': [...], 'test': [...]}`` from a folder (files whose names contain the split: several
    in one folder are its shards, read in name order) or one file. Matches in several folders (the
    Hugging Face repository's ``main/`` and ``socratic/``) are refused, naming them."""
    src = src.expanduser()
    if src.is_file():  # the split its name says, as a folder's files are matched
        splits = [split for split in ("train", "test") if split in src.name.lower()]
        if len(splits) > 1:
            raise DatasetError(f"GSM8K source file {str(src)!r}: its name names both splits; name it *train*.jsonl "
                               "or *test*.jsonl, or give the folder holding both")
        return {(splits or ["train"])[0]: [src]}  # a file named for neither split is the train split
    if not src.is_dir():
        raise DatasetError(f"GSM8K source {str(src)!r} does not exist; give the folder holding train.jsonl/test.jsonl")
    found = {}
    for split in ("train", "test"):
        matches = sorted(p for p in src.rglob(f"*{split}*") if p.suffix in SUFFIXES)
        folders = sorted({str(p.parent) for p in matches})
        if len(folders) > 1:
            raise DatasetError(f"GSM8K source {str(src)!r} holds {split} files in {len(folders)} folders "
                               f"({', '.join(folders[:4])}): give the one to read as --src (GSM8K's own "
                               "answers are main/; socratic/ holds the Socratic variant)")
        if matches:
            found[split] = matches
    if not found:
        raise DatasetError(f"no train/test .jsonl or .parquet files under {str(src)!r}")
    return found


def convert(src: str | Path, system_prompt: str | None = None) -> dict[str, list[dict[str, Any]]]:
    return {
        split: [convert_row(row, i, split, f"{path}, {where}", system_prompt)
                for i, (path, where, row) in enumerate((path, where, row) for path in paths
                                                       for where, row in read_numbered_rows(path))]
        for split, paths in find_split_files(Path(src)).items()
    }
