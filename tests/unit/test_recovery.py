"""After an engine death: unload, else stop the server for its supervisor, else keep failing."""

from lora_serving.engine.recovery import Recovery, after_engine_death


def test_a_model_that_can_unload_unloads():
    calls = []
    assert after_engine_death(lambda: calls.append("unload"), exit_on_engine_death=True) == (
        Recovery.UNLOADED,
        None,
    )
    assert calls == ["unload"]


def refused():
    raise RuntimeError("explicit model control mode is not enabled")


def test_model_control_none_stops_the_server_for_a_restart():
    action, why = after_engine_death(refused, exit_on_engine_death=True)
    assert action is Recovery.STOP_SERVER and "model control" in why


def test_exit_can_be_turned_off():
    action, why = after_engine_death(refused, exit_on_engine_death=False)
    assert action is Recovery.KEEP_FAILING and why
