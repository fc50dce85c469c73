"""The OpenAI Agents SDK against this server, on its default model: the Responses API
(OpenAIResponsesModel) with the SDK's default model settings (reasoning effort, verbosity ...),
streamed and not. Every response the agent got is then read back from the store and validated."""

from __future__ import annotations

import asyncio

import pytest
from support.scripted import forced
from support.servers import openai_client
from support.spec import assert_valid

agents = pytest.importorskip("agents")


def run_agent(server, agent, question: str, *, streamed: bool):
    """Runs the agent on one event loop with its own client; returns the run result."""
    from openai import AsyncOpenAI

    async def go():
        client = AsyncOpenAI(base_url=server.url, api_key="dummy", max_retries=0)
        agents.set_default_openai_client(client, use_for_tracing=False)
        agents.set_default_openai_api("responses")
        agents.set_tracing_disabled(True)
        try:
            if streamed:
                result = agents.Runner.run_streamed(agent, question, max_turns=4)
                kinds = [event.type async for event in result.stream_events()]
                assert "raw_response_event" in kinds
                return result
            return await agents.Runner.run(agent, question, max_turns=4)
        finally:
            await client.close()

    return asyncio.run(go())


def check_raw_responses(server, result):
    """Every model response of the run is a stored, spec-valid Response."""
    client = openai_client(server)
    ids = [r.response_id for r in result.raw_responses]
    assert ids and all(i and i.startswith("resp_") for i in ids)
    for response_id in ids:
        body = client.responses.with_raw_response.retrieve(response_id).http_response.json()
        assert_valid("Response", body)
        assert body["status"] in ("completed", "incomplete")
    return ids


def weather_tool(calls):
    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return f"It is sunny and 22 degrees in {city}."

    return get_weather


@pytest.mark.parametrize("streamed", [False, True])
def test_an_agent_with_the_default_settings(srserver, streamed):
    """The SDK's default model name and model settings, with greedy decoding and a token cap as
    the only changes (at temperature 1 a 135M model may ramble to the end of its context, which
    the SDK reports as an error). The model chooses freely whether to call the tool; either way
    the run must end with an answer."""
    from agents.models.default_models import get_default_model, get_default_model_settings

    calls: list[str] = []
    settings = get_default_model_settings().resolve(agents.ModelSettings(temperature=0, max_tokens=200))
    agent = agents.Agent(name="Weather", instructions="Answer weather questions in one sentence.",
                         tools=[weather_tool(calls)], model_settings=settings)
    result = run_agent(srserver, agent, "What is the weather in Paris?", streamed=streamed)
    assert isinstance(result.final_output, str) and result.final_output.strip()
    for response_id in check_raw_responses(srserver, result):
        body = openai_client(srserver).responses.retrieve(response_id)
        assert body.reasoning.effort == settings.reasoning.effort and body.text.verbosity == settings.verbosity
    assert get_default_model().startswith("gpt-")   # the SDK's own model name, served by the local model
    tool_outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert len(tool_outputs) == len(calls)


@pytest.mark.parametrize("streamed", [False, True])
def test_an_agent_calls_its_function_tool(srserver, script, streamed):
    """The default model settings with the tool named in tool_choice (and greedy decoding, short
    answers): the call, its output sent back, and the answer after it. The scripted host writes
    the forced call's arguments, and an answer once the call is no longer forced."""
    script.default = lambda prompt: forced({"city": "Paris"}) if prompt.text.endswith('"arguments": ') else \
        "It is sunny in Paris."
    from agents.models.default_models import get_default_model_settings

    calls: list[str] = []
    settings = get_default_model_settings().resolve(
        agents.ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=60))
    assert settings.reasoning is not None and settings.reasoning.effort is not None   # the defaults are kept
    agent = agents.Agent(name="Weather", instructions="Answer weather questions. Call get_weather first.",
                         tools=[weather_tool(calls)], model_settings=settings)
    result = run_agent(srserver, agent, "What is the weather in Paris?", streamed=streamed)
    assert len(calls) == 1 and calls[0].strip()
    types = [i.type for i in result.new_items]
    assert types == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert isinstance(result.final_output, str) and result.final_output.strip()
    first, second = check_raw_responses(srserver, result)
    # the second turn was sent the call's output, matched to the call by its call_id
    sclient = openai_client(srserver)
    call = sclient.responses.retrieve(first).output[0]
    sent = [i for i in sclient.responses.input_items.list(second) if i.type == "function_call_output"]
    assert [i.call_id for i in sent] == [call.call_id]
