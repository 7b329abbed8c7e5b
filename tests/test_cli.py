"""The command line's promises: clear one-line errors, never a traceback, for operator mistakes."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from click.testing import CliRunner

from diagnoser import __version__, cli
from tests.servers import PostgresServer, free_port, run_diagnoser


def diagnoser(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_diagnoser(*args, env=env, timeout=60)


def test_version() -> None:
    result = diagnoser("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"diagnoser {__version__}"


def test_an_invalid_setting_names_its_variable(tmp_path: Path) -> None:
    result = diagnoser(
        "serve", "--data-dir", str(tmp_path), env={"DIAGNOSER_HANG__TIMEOUT_S": "soon"}
    )
    assert result.returncode == 2
    assert "DIAGNOSER_HANG__TIMEOUT_S: Input should be a valid number" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_database_url_is_one_clear_line(tmp_path: Path) -> None:
    result = diagnoser("serve", "--data-dir", str(tmp_path), "--database-url", "mysql://x@y/z")
    assert result.returncode == 2
    assert "unsupported database backend 'mysql'" in result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        result = diagnoser("serve", "--data-dir", str(tmp_path), "--port", str(port))
    assert result.returncode == 1
    assert f"127.0.0.1:{port} is already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_unwritable_data_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = diagnoser("serve", "--data-dir", str(blocker / "data"))
    assert result.returncode == 1
    assert f"data directory {blocker / 'data'} is not writable" in result.stderr
    assert "Traceback" not in result.stderr


def test_migrate_against_a_server_that_is_down() -> None:
    url = f"postgresql+psycopg://diagnoser@127.0.0.1:{free_port()}/postgres"
    result = diagnoser("migrate", "--database-url", url)
    assert result.returncode == 1
    assert "cannot reach database postgresql+psycopg://diagnoser@127.0.0.1" in result.stderr
    assert "Traceback" not in result.stderr


def test_migrate_postgres_then_again_is_a_no_op(postgres_server: PostgresServer) -> None:
    url = postgres_server.create_database()
    first = diagnoser("migrate", "--database-url", url)
    assert first.returncode == 0, first.stderr
    again = diagnoser("migrate", "--database-url", url)
    assert again.returncode == 0
    assert "is at revision" in again.stderr


def test_rules_check_passes_on_the_shipped_pack() -> None:
    result = diagnoser("rules", "check")
    assert result.returncode == 0, result.stderr
    assert "rules in" in result.stderr


def test_rules_check_names_the_file_rule_and_reason(tmp_path: Path) -> None:
    pack = Path(__file__).resolve().parents[1] / "rules"
    broken = tmp_path / "rules"
    shutil.copytree(pack, broken)
    oom = broken / "memory.yaml"
    oom.write_text(oom.read_text().replace("action: notify_user", "action: reboot_cluster", 1))
    result = diagnoser("rules", "check", str(broken))
    assert result.returncode == 1
    assert "memory.yaml" in result.stderr
    assert "rule 'cuda_oom': action: Input should be" in result.stderr
    serve = diagnoser(
        "serve", "--data-dir", str(tmp_path / "d"), env={"DIAGNOSER_RULES_DIR": str(broken)}
    )
    assert serve.returncode == 1
    assert "memory.yaml" in serve.stderr


def test_rules_test_shows_which_rule_fires_on_which_line(tmp_path: Path) -> None:
    log = tmp_path / "node-3.log"
    log.write_text(
        "step 100 loss 2.31\n"
        "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
        "Warning: Environment variable NCCL_ASYNC_ERROR_HANDLING is deprecated; use "
        "TORCH_NCCL_ASYNC_ERROR_HANDLING instead\n"
    )
    result = diagnoser("rules", "test", str(log))
    assert result.returncode == 0
    assert "xid_fallen_off_bus" in result.stdout
    assert "1 event(s)" in result.stderr


def test_a_missing_rule_pack_says_where_to_point(tmp_path: Path) -> None:
    env = {"DIAGNOSER_RULES_DIR": str(tmp_path / "nowhere")}
    result = diagnoser("serve", "--data-dir", str(tmp_path / "d"), env=env)
    assert result.returncode == 1
    assert "no rule pack at" in result.stderr
    assert "DIAGNOSER_RULES_DIR" in result.stderr


def test_error_lines_and_rule_tests_print_text_as_written(tmp_path: Path) -> None:
    missing = diagnoser("diagnose", str(tmp_path / "[/data]" / "[rank3].log"))
    assert missing.returncode == 2
    assert f"no such file: {tmp_path}/[/data]/[rank3].log" in missing.stderr
    assert "Traceback" not in missing.stderr
    log = tmp_path / "node-3.log"
    log.write_text("[rank3]: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off [/data/x.bin]\n")
    result = diagnoser("rules", "test", str(log), env={"COLUMNS": "300"})
    assert result.returncode == 0, result.stderr
    assert "[rank3]: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off [/data/x.bin]" in (
        result.stdout
    )


HELP_COMMANDS = [
    (), ("serve",), ("migrate",), ("diagnose",), ("ship",), ("run",), ("eval",),
    ("rules", "check"), ("rules", "test"), ("diagnoses", "list"), ("diagnoses", "show"),
    ("diagnoses", "watch"), ("token", "create"), ("token", "list"), ("token", "revoke"),
    ("prune",),
]  # fmt: skip


def test_help_names_values_not_python_types() -> None:
    # In process (the same typer app the console script runs): a child per command costs minutes
    # on a loaded machine. The two below still run as a user runs them.
    runner = CliRunner(env={"COLUMNS": "200", "TERM": "dumb"})
    for command in HELP_COMMANDS:
        result = runner.invoke(cli.command(), [*command, "--help"], prog_name="diagnoser")
        assert result.exit_code == 0, (command, result.output)
        for label in ("<bool>", "<str>", "<int", "<float", "<list[", "<path>", "{"):
            assert label not in result.output, (command, label)
    diagnose = diagnoser("diagnose", "--help", env={"COLUMNS": "200"}).stdout
    assert "Usage: diagnoser diagnose [OPTIONS] FILE..." in diagnose
    assert "--node-map            FILE=NODE" in diagnose
    assert "[default: DIAGNOSER_HANG__TIMEOUT_S]" in diagnose
    serve = diagnoser("serve", "--help", env={"COLUMNS": "200"}).stdout
    assert "--data-dir            DIR" in serve
    assert "[env DIAGNOSER_DATA_DIR]" in serve


def test_operator_names_an_unknown_action_kind() -> None:
    result = diagnoser(
        "operator", "--server", "http://127.0.0.1:9", "--kinds", "cordon_node,reboot"
    )
    assert result.returncode == 2
    assert "unknown action kind 'reboot'" in result.stderr
    assert "Traceback" not in result.stderr


def test_operator_does_not_claim_notify_actions() -> None:
    result = diagnoser("operator", "--server", "http://127.0.0.1:9", "--kinds", "notify")
    assert result.returncode == 2
    assert "delivered by the service's notifier" in result.stderr


def test_operator_names_an_unknown_workload_kind() -> None:
    result = diagnoser(
        "operator", "--server", "http://127.0.0.1:9", "--restart-workloads", "Job,Deployment"
    )
    assert result.returncode == 2
    assert "unknown workload kind 'Deployment'" in result.stderr


def test_operator_without_a_kubeconfig_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "kubeconfig"
    result = diagnoser("operator", "--server", "http://127.0.0.1:9", "--kubeconfig", str(missing))
    assert result.returncode == 2
    assert "no usable Kubernetes configuration" in result.stderr
    assert "Traceback" not in result.stderr
