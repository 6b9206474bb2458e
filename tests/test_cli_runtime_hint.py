"""`gc3 <runtime command>` where no installed package declares the runtime's commands (a checkout
on PYTHONPATH): the error says where those commands come from and how to reach them."""
from click.testing import CliRunner

import gc3.cli as cli


def run(args, monkeypatch, plugins):
    monkeypatch.setattr(cli, "_plugins", plugins)
    return CliRunner().invoke(cli.main, args)


def test_without_the_runtimes_entry_points_the_error_says_where_its_commands_come_from(monkeypatch):
    res = run(["no-such-command", "-d", "bfloat16"], monkeypatch, [])
    assert res.exit_code == 2
    assert "No such command 'no-such-command'. No installed package declares the GPU runtime's commands" \
        in res.output
    assert "pip install -e ." in res.output and "python -m" in res.output


def test_an_unknown_command_with_the_runtime_installed_gets_no_hint(monkeypatch):
    res = run(["no-such-command"], monkeypatch, ["bench", "tune"])
    assert res.exit_code == 2 and "No such command 'no-such-command'" in res.output
    assert "runtime" not in res.output


def test_a_bad_option_is_not_taken_for_a_command(monkeypatch):
    res = run(["--no-such-option"], monkeypatch, [])
    assert res.exit_code == 2 and "runtime" not in res.output
