import numpy as np
import pytest
import torch

from rlvr.protocol import DataProto, DataProtoError


def make(n=3):
    return DataProto.from_single_dict(
        {
            "input_ids": torch.arange(n * 2).reshape(n, 2),
            "uid": [f"u{i}" for i in range(n)],
            "raw_prompt_ids": [[i] * (i + 1) for i in range(n)],  # ragged: stays one object per row
        },
        meta_info={"temperature": 1.0},
    )


def test_from_single_dict_sorts_tensors_and_non_tensors():
    dp = make()
    assert list(dp.batch) == ["input_ids"]
    assert set(dp.non_tensor_batch) == {"uid", "raw_prompt_ids"}
    assert dp.non_tensor_batch["raw_prompt_ids"][2] == [2, 2, 2]
    assert dp.non_tensor_batch["uid"].dtype == object
    assert len(dp) == 3 and dp.meta_info == {"temperature": 1.0}


def test_from_dict_rejects_non_tensor_in_tensors():
    with pytest.raises(DataProtoError, match=r"tensors\['x'\] is a list"):
        DataProto.from_dict({"x": [1, 2]})


def test_length_mismatch_names_key_and_both_lengths():
    with pytest.raises(DataProtoError, match=r"'uid' has 2 rows but 'input_ids' has 3"):
        DataProto.from_dict({"input_ids": torch.zeros(3, 2)}, {"uid": ["a", "b"]})


def test_check_consistency_after_manual_edit():
    dp = make()
    dp.batch["bad"] = torch.zeros(5)
    with pytest.raises(DataProtoError, match="'bad' has 5 rows"):
        dp.check_consistency()


def test_pop_removes_and_returns():
    dp = make()
    gen = dp.pop(batch_keys=["input_ids"], non_tensor_batch_keys=["raw_prompt_ids"], meta_info_keys=["temperature"])
    assert list(gen.batch) == ["input_ids"] and list(gen.non_tensor_batch) == ["raw_prompt_ids"]
    assert gen.meta_info == {"temperature": 1.0}
    assert "input_ids" not in dp.batch and "raw_prompt_ids" not in dp.non_tensor_batch and dp.meta_info == {}
    assert len(dp) == 3  # uid is still there


def test_pop_missing_key_names_it():
    with pytest.raises(DataProtoError, match=r"batch has no key\(s\) \['responses'\]"):
        make().pop(batch_keys=["responses"])


def test_select_and_deepcopy():
    dp = make()
    sel = dp.select(batch_keys=["input_ids"], non_tensor_batch_keys=[], deepcopy=True)
    sel.batch["input_ids"][0, 0] = 99
    assert dp.batch["input_ids"][0, 0] == 0
    shallow = dp.select(batch_keys=["input_ids"])
    shallow.batch["input_ids"][0, 0] = 77
    assert dp.batch["input_ids"][0, 0] == 77


def test_union_merges_and_accepts_equal_shared_keys():
    dp = make()
    other = DataProto.from_dict(
        {"input_ids": dp.batch["input_ids"].clone(), "responses": torch.ones(3, 4)},
        {"uid": ["u0", "u1", "u2"]},
        {"temperature": 1.0, "gen_time": 2.0},
    )
    out = dp.union(other)
    assert out is dp
    assert set(dp.batch) == {"input_ids", "responses"}
    assert dp.meta_info == {"temperature": 1.0, "gen_time": 2.0}


@pytest.mark.parametrize(
    "other",
    [
        DataProto.from_dict({"input_ids": torch.zeros(3, 2, dtype=torch.long)}),
        DataProto.from_dict(non_tensors={"uid": ["u0", "u1", "X"]}),
        DataProto(meta_info={"temperature": 0.5}),
    ],
)
def test_union_refuses_conflicting_values(other):
    with pytest.raises(DataProtoError, match="union conflict"):
        make().union(other)


def test_union_refuses_different_lengths():
    with pytest.raises(DataProtoError, match="3 rows with one of 2 rows"):
        make().union(DataProto.from_dict({"x": torch.zeros(2)}))


def test_repeat_interleaved_vs_blocked():
    dp = make(2)
    inter = dp.repeat(3, interleave=True)
    # interleaved: each prompt's copies are adjacent -> a a a b b b
    assert inter.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u0", "u1", "u1", "u1"]
    assert inter.batch["input_ids"][:, 0].tolist() == [0, 0, 0, 2, 2, 2]
    blocked = dp.repeat(3, interleave=False)
    # blocked: the whole batch three times -> a b a b a b
    assert blocked.non_tensor_batch["uid"].tolist() == ["u0", "u1"] * 3
    assert blocked.batch["input_ids"][:, 0].tolist() == [0, 2, 0, 2, 0, 2]
    assert blocked.non_tensor_batch["raw_prompt_ids"][3] == [1, 1]
    with pytest.raises(DataProtoError):
        dp.repeat(0)


def test_split_and_chunk():
    dp = make(5)
    parts = dp.split(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert parts[2].non_tensor_batch["uid"].tolist() == ["u4"]
    assert [len(p) for p in make(6).chunk(3)] == [2, 2, 2]
    with pytest.raises(DataProtoError, match="multiple of 2"):
        dp.chunk(2)


def test_concat_roundtrip_and_key_mismatch():
    dp = make(5)
    again = DataProto.concat(dp.split(2))
    assert torch.equal(again.batch["input_ids"], dp.batch["input_ids"])
    assert again.non_tensor_batch["uid"].tolist() == dp.non_tensor_batch["uid"].tolist()
    with pytest.raises(DataProtoError, match="part 1 has keys"):
        DataProto.concat([make(2), make(2).select(batch_keys=["input_ids"], non_tensor_batch_keys=[])])
    with pytest.raises(DataProtoError, match="trailing shapes"):
        DataProto.concat([make(2), DataProto.from_single_dict({"input_ids": torch.zeros(2, 5, dtype=torch.long),
                                                                "uid": ["a", "b"], "raw_prompt_ids": [[1], [2]]})])


def test_concat_merges_meta_info_and_gathers_metrics_from_every_part():
    parts = make(4).split(2)
    parts[0].meta_info.update(metrics={"actor/pg_loss": 1.0, "actor/lr": 0.1}, only_first=1)
    parts[1].meta_info.update(metrics={"actor/pg_loss": 3.0, "actor/lr": 0.1}, only_second="b")
    merged = DataProto.concat(parts).meta_info
    # keys of both parts are kept (verl), shared non-metric keys agree, metrics are a dict of lists
    assert merged["temperature"] == 1.0 and merged["only_first"] == 1 and merged["only_second"] == "b"
    assert merged["metrics"] == {"actor/pg_loss": [1.0, 3.0], "actor/lr": [0.1, 0.1]}


def test_concat_refuses_conflicting_meta_info():
    parts = make(4).split(2)
    parts[1].meta_info["temperature"] = 0.7
    with pytest.raises(DataProtoError, match=r"meta_info\['temperature'\] is 1.0 in an earlier part but 0.7 in part 1"):
        DataProto.concat(parts)


def test_reorder_permutes_all_columns():
    dp = make(3)
    dp.reorder(torch.tensor([2, 0, 1]))
    assert dp.non_tensor_batch["uid"].tolist() == ["u2", "u0", "u1"]
    assert dp.batch["input_ids"][:, 0].tolist() == [4, 0, 2]
    with pytest.raises(DataProtoError, match="permutation"):
        dp.reorder([0, 0, 1])


def test_getitem_slice_int_indices_and_key():
    dp = make(4)
    assert dp[1:3].non_tensor_batch["uid"].tolist() == ["u1", "u2"]
    assert dp.slice(0, 4, 2).non_tensor_batch["uid"].tolist() == ["u0", "u2"]
    assert dp[-1].non_tensor_batch["uid"].tolist() == ["u3"]
    assert dp[[3, 0]].batch["input_ids"][:, 0].tolist() == [6, 0]
    assert dp[np.array([True, False, False, True])].non_tensor_batch["uid"].tolist() == ["u0", "u3"]
    assert dp["input_ids"] is dp.batch["input_ids"]
    with pytest.raises(KeyError, match="no key 'nope'"):
        dp["nope"]
    with pytest.raises(IndexError):
        dp[4]


def test_to_device_and_len_of_empty():
    dp = make().to("cpu")
    assert dp.batch["input_ids"].device.type == "cpu"
    assert len(DataProto()) == 0


def test_require_names_missing_keys():
    with pytest.raises(DataProtoError, match=r"reward needs key\(s\) \['responses'\]"):
        make().require("input_ids", "responses", stage="reward")


def test_save_and_load(tmp_path):
    dp = make()
    dp.save_to_disk(tmp_path / "batch.pt")
    back = DataProto.load_from_disk(tmp_path / "batch.pt")
    assert torch.equal(back.batch["input_ids"], dp.batch["input_ids"])
    assert back.non_tensor_batch["raw_prompt_ids"][1] == [1, 1]
    assert back.meta_info == dp.meta_info
    assert not (tmp_path / "batch.pt.tmp").exists()


def test_concat_rollouts_pads_prompts_left_and_responses_right():
    from rlvr.protocol import concat_rollouts

    def rollout(prompt, response):
        P, R = len(prompt), len(response)
        ids = torch.tensor([prompt + response])
        return DataProto.from_dict({"input_ids": ids, "attention_mask": torch.ones(1, P + R, dtype=torch.long),
                                    "position_ids": torch.arange(P + R)[None], "prompts": ids[:, :P],
                                    "responses": ids[:, P:], "response_mask": torch.ones(1, R, dtype=torch.long),
                                    "token_level_scores": torch.tensor([[0.0] * (R - 1) + [1.0]])},
                                   {"uid": ["a"]})

    out = concat_rollouts([rollout([5, 6], [7, 8, 9]), rollout([4, 5, 6], [7])], pad_id=0)
    assert out.batch["input_ids"].tolist() == [[0, 5, 6, 7, 8, 9], [4, 5, 6, 7, 0, 0]]
    assert out.batch["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
    assert out.batch["position_ids"].tolist() == [[0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]]
    assert out.batch["prompts"].tolist() == [[0, 5, 6], [4, 5, 6]]
    assert out.batch["responses"].tolist() == [[7, 8, 9], [7, 0, 0]]
    assert out.batch["token_level_scores"].tolist() == [[0, 0, 1], [1, 0, 0]]
    assert out.non_tensor_batch["uid"].tolist() == ["a", "a"]
