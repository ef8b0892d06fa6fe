"""The LLM agent on any OpenAI-compatible endpoint, and how its model calls are recorded.

``agent`` (the loop and its configuration), ``client`` (HTTP with retries by cause),
``record`` (content-addressed, delta-encoded model-call records and their reconstruction),
``tito`` (token in, token out), ``testing`` (a scripted OpenAI-compatible server on loopback: a test double,
never used by the fleet), ``proxy`` (a recording proxy for tests against real servers).
"""

from producers.fleet.llm.agent import POLICY_VERSION, LLMAgent, LLMConfig
from producers.fleet.llm.record import CallRecorder, ContentStore, reconstruct

__all__ = ["POLICY_VERSION", "CallRecorder", "ContentStore", "LLMAgent", "LLMConfig", "reconstruct"]
