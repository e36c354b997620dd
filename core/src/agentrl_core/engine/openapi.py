"""The OpenAPI 3.0 document of the hf engine's API (SGLang's native routes and OpenAI's), at ``/openapi.json``.

Written by hand next to :mod:`agentrl_core.engine.server`; a test checks that every route of
the engine appears here and fuzzes a real engine from it (schemathesis).
"""

from __future__ import annotations

from typing import Any

from agentrl_core.http.openapi import OBJECT, document, json_content, operation, ref, text_content

_WEIGHTS = "The outcome: {success, message}; success false with 400 when refused."


def engine_openapi(version: str) -> dict[str, Any]:
    number = {"type": "number"}
    sampling = {
        "type": "object",
        "description": "SGLang's sampling_params (the hf engine takes a subset).",
        "properties": {
            "temperature": number, "top_p": number, "top_k": {"type": "integer"}, "min_p": number,
            "max_new_tokens": {"type": "integer"}, "stop": {"oneOf": [{"type": "string"}, {"type": "array"}]},
            "stop_token_ids": {"type": "array", "items": {"type": "integer"}}, "ignore_eos": {"type": "boolean"},
            "skip_special_tokens": {"type": "boolean"}, "no_stop_trim": {"type": "boolean"},
            "seed": {"type": "integer"}, "sampling_seed": {"type": "integer"},
        },
    }
    schemas = {
        "Generate": {
            "type": "object",
            "properties": {
                "input_ids": {"type": "array", "items": {"type": "integer"}},
                "text": {"type": "string"},
                "sampling_params": ref("SamplingParams"),
                "rid": {"type": "string"},
                "return_logprob": {"type": "boolean"},
                "lora_path": {"type": "string"},
                "stream": {"type": "boolean"},
            },
        },
        "SamplingParams": sampling,
        "ChatCompletion": {
            "type": "object",
            "required": ["messages"],
            "properties": {
                "model": {"type": "string"},
                "messages": {"type": "array", "items": {"type": "object", "properties": {
                    "role": {"type": "string"}, "content": {"nullable": True}}}},
                "tools": {"type": "array", "items": OBJECT},
                "tool_choice": {"nullable": True},
                "max_tokens": {"type": "integer"}, "max_completion_tokens": {"type": "integer"},
                "temperature": number, "top_p": number, "stop": {"nullable": True}, "seed": {"type": "integer"},
                "logprobs": {"type": "boolean"}, "n": {"type": "integer"}, "stream": {"type": "boolean"},
                "chat_template_kwargs": OBJECT,
            },
        },
        "WeightResult": {"type": "object", "required": ["success", "message"],
                         "properties": {"success": {"type": "boolean"}, "message": {"type": "string"}}},
        "InitGroup": {
            "type": "object",
            "required": ["master_address", "master_port", "rank_offset", "world_size"],
            "properties": {"master_address": {"type": "string"}, "master_port": {"type": "integer"},
                           "rank_offset": {"type": "integer"}, "world_size": {"type": "integer"},
                           "group_name": {"type": "string"}, "backend": {"type": "string"}},
        },
        "UpdateDistributed": {
            "type": "object",
            "required": ["names", "dtypes", "shapes"],
            "properties": {"names": {"type": "array", "items": {"type": "string"}},
                           "dtypes": {"type": "array", "items": {"type": "string"}},
                           "shapes": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                           "group_name": {"type": "string"}, "weight_version": {"type": "string"}},
        },
    }
    weights = json_content(ref("WeightResult"), _WEIGHTS)
    refused = {"400": weights}
    empty = {"description": "Healthy (no body)."}
    info = json_content(OBJECT, "About the model and engine.")
    flushed = text_content("How many cached prefixes were dropped.")
    adapters = json_content({"type": "object", "required": ["success", "loaded_adapters"], "properties": {
        "success": {"type": "boolean"}, "error_message": {"type": "string", "nullable": True},
        "loaded_adapters": OBJECT}}, "The adapters loaded now, by name (path as value).")
    memory = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}}
    paths = {
        "/generate": {"post": operation(
            "SGLang's /generate: one completion of input_ids (or text).",
            json_content({"type": "object", "required": ["text", "output_ids", "meta_info"], "properties": {
                "text": {"type": "string"}, "output_ids": {"type": "array"}, "meta_info": OBJECT}}, "The completion."),
            codes=(400, 503), body=ref("Generate"))},
        "/health": {"get": operation("Liveness.", empty, codes=(503,))},
        "/health_generate": {"get": operation("Liveness (SGLang's name).", empty, codes=(503,))},
        "/get_model_info": {"get": operation("The model.", info)},
        "/model_info": {"get": operation("The model.", info)},
        "/get_server_info": {"get": operation("Load and counters.", json_content(OBJECT, "Server info."))},
        "/server_info": {"get": operation("Load and counters.", json_content(OBJECT, "Server info."))},
        "/flush_cache": {"get": operation("Drop cached prefixes.", flushed),
                         "post": operation("Drop cached prefixes.", flushed)},
        "/abort_request": {"post": operation(
            "Abort one request (rid) or all.", json_content(OBJECT, "Aborted."), codes=(400,),
            body={"type": "object", "properties": {"rid": {"type": "string"}, "abort_all": {"type": "boolean"}}},
            body_required=False)},
        "/pause_generation": {"post": operation(
            "Pause before a weight update.", json_content(OBJECT, "Paused."), codes=(400,),
            body={"type": "object", "properties": {"mode": {"type": "string"}}}, body_required=False)},
        "/continue_generation": {"post": operation(
            "Resume after a weight update.", json_content(OBJECT, "Resumed."), codes=(400, 409),
            body={"type": "object", "properties": {"allow_partial_update": {"type": "boolean"}}},
            body_required=False)},
        "/init_weights_update_group": {"post": operation(
            "Join the learner's weight-update process group.", weights, body=ref("InitGroup"), codes=(),
            responses=refused)},
        "/destroy_weights_update_group": {"post": operation(
            "Leave a weight-update group.", weights, body={"type": "object", "properties": {
                "group_name": {"type": "string"}}}, body_required=False, responses=refused)},
        "/update_weights_from_distributed": {"post": operation(
            "Receive tensors broadcast in the group (the engine must be paused).", weights,
            body=ref("UpdateDistributed"), responses={**refused, "409": weights})},
        "/update_weights_from_disk": {"post": operation(
            "Load weights from a safetensors checkpoint on this machine.", weights,
            body={"type": "object", "required": ["model_path"], "properties": {
                "model_path": {"type": "string"}, "weight_version": {"type": "string"}}}, responses=refused)},
        "/load_lora_adapter": {"post": operation(
            "Serve a PEFT LoRA folder under lora_name (SGLang's route; /generate picks it with lora_path).",
            adapters, body={"type": "object", "required": ["lora_name", "lora_path"], "properties": {
                "lora_name": {"type": "string"}, "lora_path": {"type": "string"}}}, codes=(),
            responses={"400": adapters, "409": adapters})},
        "/unload_lora_adapter": {"post": operation(
            "Stop serving an adapter (refused while a request uses it).", adapters,
            body={"type": "object", "required": ["lora_name"], "properties": {"lora_name": {"type": "string"}}},
            codes=(), responses={"400": adapters, "409": adapters})},
        "/release_memory_occupation": {"post": operation(
            "Free the KV cache (and offload the weights on a GPU) while paused; answers null.",
            json_content({"nullable": True}, "Released."), codes=(400, 409), body=memory, body_required=False)},
        "/resume_memory_occupation": {"post": operation(
            "Take the released memory back; answers null.", json_content({"nullable": True}, "Resumed."),
            codes=(400,), body=memory, body_required=False)},
        "/v1/chat/completions": {"post": operation(
            "OpenAI chat completion (tools parsed by the engine's tool parser).",
            json_content(OBJECT, "A chat.completion."), codes=(400, 503), body=ref("ChatCompletion"))},
        "/v1/models": {"get": operation("The served model.", json_content(OBJECT, "A list of one model."))},
        "/openapi.json": {"get": operation("This document.", json_content(OBJECT, "OpenAPI 3.0."))},
    }
    return document("agentrl hf engine", version, "SGLang-compatible generation server over Hugging Face "
                    "transformers (HTTP).", paths, schemas)
