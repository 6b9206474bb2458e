"""`gc3 <runtime command>` where no installed package declares the runtime's commands (a checkout
on PYTHONPATH): the error says where those commands come from and how to reach them."""
from click.testing import CliRunner

import gc3.cli as cli


def run(args, monkeypatch, plugins, runtime_found):
    monkeypatch.setattr(cli, "_plugins", plugins)
    monkeypatch.setattr(cli, "find_spec", lambda name: object() if runtime_found and name == "runtime_cuda" else None)
    return CliRunner().invoke(cli.main, args)


def test_a_checkout_without_entry_points_is_told_to_use_python_m_runtime_cuda(monkeypatch):
    res = run(["no-such-command", "-d", "bfloat16"], monkeypatch, [], True)
    assert res.exit_code == 2
    assert "No such command 'no-such-command'" in res.output
    assert "python -m runtime_cuda no-such-command" in res.output and "pip install -e ." in res.output


def test_without_any_runtime_it_says_to_install_one(monkeypatch):
    res = run(["no-such-command"], monkeypatch, [], False)
    assert res.exit_code == 2 and "No GPU runtime is installed" in res.output
    assert "python -m runtime_cuda" not in res.output


def test_an_unknown_command_with_the_runtime_installed_gets_no_hint(monkeypatch):
    res = run(["no-such-command"], monkeypatch, ["bench", "tune"], True)
    assert res.exit_code == 2 and "No such command 'no-such-command'" in res.output
    assert "runtime" not in res.output


def test_a_bad_option_is_not_taken_for_a_command(monkeypatch):
    res = run(["--no-such-option"], monkeypatch, [], True)
    assert res.exit_code == 2 and "runtime" not in res.output
