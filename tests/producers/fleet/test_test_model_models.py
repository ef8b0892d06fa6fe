"""The test model server answers ``GET /v1/models`` as OpenAI-compatible servers do (clients list models first)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from producers.fleet.llm.testing import FakeOpenAIServer, loop_script


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def _chat(url: str, model: str) -> int:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp"])
def test_models_lists_the_served_model_and_a_listed_name_is_answered(engine: str) -> None:
    with FakeOpenAIServer(loop_script(1), model="policy-7b", engine=engine) as server:
        status, listing = _get(f"{server.url}/models")
        assert status == 200 and listing["object"] == "list"
        assert [(m["id"], m["object"]) for m in listing["data"]] == [("policy-7b", "model")]
        assert _chat(server.url, listing["data"][0]["id"]) == 200
        assert server.paths == ["/v1/chat/completions"]  # a listing is not a model call


def test_models_lists_every_served_name_and_other_gets_are_404() -> None:
    with FakeOpenAIServer(loop_script(1), models=["b-model", "a-model"]) as server:
        status, listing = _get(f"{server.url}/models/")
        assert status == 200 and [m["id"] for m in listing["data"]] == ["a-model", "b-model"]
        assert _chat(server.url, "c-model") == 404  # an unlisted name is refused, as before
        status, body = _get(f"{server.url}/chat/completions")
        assert status == 404 and "error" in body
