"""Settings precedence: CLI flag > environment > host settings > settings.json > default."""

from __future__ import annotations

import json

import pytest
from support import ROOT

from openai_ext.core.config import Settings, SettingsError, defaults, load_settings


@pytest.fixture
def settings_file(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"port": 6001, "max_n": 3, "api_key": "from-file", "debug": True}))
    return path


def test_defaults(tmp_path, monkeypatch):
    for var in ("OPENEDAI_PORT", "OPENEDAI_LISTEN", "OPENEDAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    s = load_settings(file=tmp_path / "absent.json")
    assert (s.port, s.listen, s.api_key, s.max_queue) == (5001, False, "", 64)


def test_each_layer_beats_the_one_below(settings_file, monkeypatch):
    monkeypatch.delenv("OPENEDAI_PORT", raising=False)
    assert load_settings(file=settings_file).port == 6001
    assert load_settings(host={"port": 6002}, file=settings_file).port == 6002
    monkeypatch.setenv("OPENEDAI_PORT", "6003")
    assert load_settings(host={"port": 6002}, file=settings_file).port == 6003
    assert load_settings(cli={"port": 6004}, host={"port": 6002}, file=settings_file).port == 6004
    # an unset flag (None) does not hide the layers below
    assert load_settings(cli={"port": None}, file=settings_file).port == 6003


def test_environment_values_are_parsed(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENEDAI_LISTEN", "true")
    monkeypatch.setenv("OPENEDAI_MAX_N", "5")
    s = load_settings(file=tmp_path / "absent.json")
    assert s.listen is True and s.max_n == 5


def test_invalid_settings_raise_a_clear_error_not_an_exit(tmp_path, monkeypatch):
    """A SettingsError (an Exception): inside the web UI a SystemExit would end the whole UI.
    The standalone entry point turns it into an exit (test_cli)."""
    bad = tmp_path / "s.json"
    bad.write_text('{"port": "not a number"}')
    with pytest.raises(SettingsError) as e:
        load_settings(file=bad)
    assert "port" in str(e.value) and isinstance(e.value, ValueError)
    bad.write_text("{oops")
    with pytest.raises(SettingsError) as e:
        load_settings(file=bad)
    assert "not valid JSON" in str(e.value)
    bad.write_text("[1, 2]")
    with pytest.raises(SettingsError, match="JSON object"):
        load_settings(file=bad)
    bad.write_bytes(b'{"api_key": "\xff"}')
    with pytest.raises(SettingsError, match="UTF-8"):
        load_settings(file=bad)
    monkeypatch.setenv("OPENEDAI_CORS_ORIGINS", "http://localhost:3000")   # a list must be JSON
    with pytest.raises(SettingsError, match="cors_origins"):
        load_settings(file=tmp_path / "absent.json")


def test_defaults_hold_every_setting_as_fresh_copies():
    first, second = defaults(), defaults()
    assert set(first) == set(Settings.model_fields)
    assert first["port"] == 5001 and first["cors_origins"] == ["*"]
    first["cors_origins"].append("http://x")
    assert second["cors_origins"] == ["*"] and defaults()["cors_origins"] == ["*"]
    Settings(**first)


def test_shipped_settings_json_is_valid():
    from openai_ext.core.config import SETTINGS_FILE

    data = json.loads(SETTINGS_FILE.read_text())
    unknown = set(data) - set(Settings.model_fields)
    assert not unknown, f"settings.json has keys the server does not know: {unknown}"
    Settings(**data)


def test_readme_shows_the_generated_settings_table_and_ci_runs_its_test_command():

    from openai_ext.core.config import markdown_table

    root = ROOT
    readme = (root / "README.md").read_text()
    assert markdown_table() in readme, "README's settings table is stale: paste config.markdown_table()"
    test_command = next(line for line in readme.splitlines()
                        if "requirements-dev.txt" in line and "python -m pytest" in line)
    assert test_command in (root / ".ci" / "run").read_text()
