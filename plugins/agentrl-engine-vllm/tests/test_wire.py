"""The protocol translation and the digest comparison, without a server."""

from __future__ import annotations

import pytest
import torch
from agentrl_engine_vllm.digests import compare, hf_layout, tensor_digest
from agentrl_engine_vllm.wire import WireError, sglang_answer, vllm_sampling_params


def test_sampling_params_map_to_vllm_names():
    params = vllm_sampling_params({"temperature": 0.7, "top_p": 1.0, "top_k": -1, "max_new_tokens": 24,
                                   "stop_token_ids": [5], "stop": "</a>", "sampling_seed": 7, "no_stop_trim": True})
    assert params == {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "max_tokens": 24,
                      "ignore_eos": False, "skip_special_tokens": True, "include_stop_str_in_output": True,
                      "stop": ["</a>"], "stop_token_ids": [5], "seed": 7, "logprobs": 0}
    assert "logprobs" not in vllm_sampling_params({}, return_logprob=False)
    assert vllm_sampling_params({})["max_tokens"] == 128  # the hf engine's default


@pytest.mark.parametrize("raw, message", [
    ({"repetition_penalty": 1.2}, "repetition_penalty=1.2 is not supported"),
    ({"n": 2}, "n=2 is not supported"),
    ({"temprature": 1.0}, "unknown sampling_params ['temprature']"),
    ({"top_p": 0}, "top_p must be in (0, 1]"),
    ({"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
    ({"stop_token_ids": ["x"]}, "stop_token_ids must be a list of token ids"),
    ({"temperature": "hot"}, "temperature must be a number"),
])
def test_unsupported_sampling_params_are_refused_in_one_sentence(raw, message):
    with pytest.raises(WireError) as info:
        vllm_sampling_params(raw)
    assert message in str(info.value)


def _choice(ids, reason="stop", stop_reason=None, spans=(("3", 0, None),)):
    return {"token_ids": ids, "finish_reason": reason, "stop_reason": stop_reason,
            "logprobs": {"content": [{"token_id": t, "logprob": -0.5 - i} for i, t in enumerate(ids)]},
            "weight_versions": [{"version": v, "start": s, "end": len(ids) if e is None else e} for v, s, e in spans]}


def decode(ids):
    return "".join(chr(ord("a") + i) for i in ids)


def test_an_eos_stop_keeps_the_token_and_names_it():
    answer = sglang_answer(_choice([1, 2, 9]), rid="r", prompt_tokens=4, decode=decode)
    assert answer["output_ids"] == [1, 2, 9] and answer["text"] == "bc"
    meta = answer["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": 9}
    assert meta["output_token_logprobs"] == [[-0.5, 1, None], [-1.5, 2, None], [-2.5, 9, None]]
    assert meta["weight_version"] == 3 and meta["weight_versions"] == [{"version": 3, "start": 0, "end": 3}]


def test_a_stop_string_is_trimmed_from_the_text_only():
    answer = sglang_answer(_choice([0, 1, 2, 3], stop_reason="cd"), rid="r", prompt_tokens=1, decode=decode)
    assert answer["output_ids"] == [0, 1, 2, 3] and answer["text"] == "ab"
    kept = sglang_answer(_choice([0, 1, 2, 3], stop_reason="cd"), rid="r", prompt_tokens=1, decode=decode,
                         no_stop_trim=True)
    assert kept["text"] == "abcd"


def test_length_abort_and_two_versions():
    assert sglang_answer(_choice([1], "length"), rid="r", prompt_tokens=1, decode=decode)["meta_info"][
        "finish_reason"] == {"type": "length"}
    aborted = sglang_answer(_choice([1, 2], "abort"), rid="r", prompt_tokens=1, decode=decode)
    assert aborted["meta_info"]["finish_reason"]["type"] == "abort" and aborted["output_ids"] == [1, 2]
    # a request paused with retract (vLLM's keep) across an update: kept as it is, every span with its version
    spanning = sglang_answer(_choice([1, 2, 3], "length", spans=(("1", 0, 2), ("2", 2, 3))), rid="r",
                             prompt_tokens=1, decode=decode)
    meta = spanning["meta_info"]
    assert meta["finish_reason"] == {"type": "length"} and spanning["output_ids"] == [1, 2, 3]
    assert meta["weight_versions"] == [{"version": 1, "start": 0, "end": 2}, {"version": 2, "start": 2, "end": 3}]
    assert meta["weight_version"] == 2  # the last token's, as SGLang reports it


class _Fused(torch.nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.output_sizes = sizes
        self.weight = torch.nn.Parameter(torch.arange(sum(sizes) * 2, dtype=torch.float32).reshape(sum(sizes), 2))


class _Attn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = _Fused([2, 1, 1])


class _Model(torch.nn.Module):
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}

    def __init__(self):
        super().__init__()
        self.attn = _Attn()
        self.norm = torch.nn.Parameter(torch.ones(3))


def test_fused_parameters_are_cut_back_into_hugging_face_tensors():
    model = _Model()
    layout = dict(hf_layout(model))
    assert list(layout) == ["norm", "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight"]
    assert layout["attn.k_proj.weight"].tolist() == [[4.0, 5.0]]
    engine = {n: {"sha256": tensor_digest(t), "dtype": "float32"} for n, t in layout.items()}
    sent = [("attn.q_proj.weight", torch.tensor([[0.0, 1.0], [2.0, 3.0]])), ("attn.k_proj.weight", torch.tensor([[4.0, 5.0]])),
            ("attn.v_proj.weight", torch.tensor([[6.0, 7.0]])), ("norm", torch.ones(3))]
    assert compare(sent, engine) == []
    sent[1] = ("attn.k_proj.weight", torch.tensor([[4.0, 5.000001]]))
    assert compare(sent, engine) == ["attn.k_proj.weight: the engine's float32 values differ from the ones sent"]
    assert compare(sent[2:], engine)[-2:] == ["attn.q_proj.weight: not sent, the engine kept its old values",
                                              "attn.k_proj.weight: not sent, the engine kept its old values"]
