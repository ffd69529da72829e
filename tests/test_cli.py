"""The ``coschedule`` command as users run it: explain and certs, as real processes."""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from coschedule.cli.main import build_parser
from coschedule.marks import run_placeholder
from tests.conftest import PATIENCE_SECONDS
from tests.fixtures import pod_path

ROOT = Path(__file__).resolve().parent.parent


def run(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coschedule.cli.main", *args],
        capture_output=True,
        text=True,
        input=stdin,
        cwd=ROOT,
        timeout=PATIENCE_SECONDS,  # a command starts in a second, or a minute on a busy machine
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **(env or {})},
    )


def test_explain_text_shows_the_gate_by_default_and_why() -> None:
    """Placement auto (the default): a TaskRun's pod, its placeholder not bound (explain
    sees no cluster), is held behind the placeholder's gate, and explain says so."""
    result = run("explain", "-f", str(pod_path("tekton-taskrun")), "--mode", "pipelineruns")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert '"op":"add","path":"/spec/schedulingGates"' in out
    assert "placement: by node name" in out
    assert "podAffinity" not in out


def test_explain_text_shows_patch_affinity_and_reasons(tmp_path: Path) -> None:
    (tmp_path / "placement").write_text("pod-affinity")
    result = run(
        "explain",
        "-f",
        str(pod_path("tekton-taskrun")),
        "--mode",
        "pipelineruns",
        "--config-dir",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "decision:    allowed" in out
    assert f"placeholder: {run_placeholder('ci', 'pr-7f3k2')}" in out
    assert "from label tekton.dev/pipelineRun" in out
    assert "--mode pipelineruns" in out
    assert '"op":"add","path":"/spec/affinity"' in out
    assert "resulting affinity:" in out


def test_explain_json_and_namespace_mode() -> None:
    result = run(
        "explain",
        "-f",
        str(pod_path("tekton-taskrun-two-workspaces")),
        "--namespace-mode",
        "isolate-pipelinerun",
        "-o",
        "json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["allowed"] is True
    assert report["mode"] == "isolate-pipelinerun"
    assert any("namespace label" in reason for reason in report["reasons"])


def test_explain_denial_exits_0_with_rule() -> None:
    result = run("explain", "-f", str(pod_path("tekton-taskrun-two-workspaces")))
    assert result.returncode == 0
    assert "DENIED" in result.stdout
    assert "workspaces-single-claim" in result.stdout


def test_explain_reads_yaml_from_stdin() -> None:
    pod_yaml = (
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: ci\n"
        "  labels: {coschedule.dev/group: g}\nspec:\n  containers: [{name: c, image: busybox}]\n"
    )
    result = run("explain", "-f", "-", "--mode", "pipelineruns", stdin=pod_yaml)
    assert result.returncode == 0, result.stderr
    assert run_placeholder("ci", "g") in result.stdout


def test_explain_shows_claim_rewrite_with_claims_file(tmp_path: Path) -> None:
    claims = tmp_path / "pvcs.yaml"
    claims.write_text(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: pvc-1f1344866c\n"
        "  namespace: ci\n  ownerReferences:\n  - {apiVersion: tekton.dev/v1, kind: PipelineRun,"
        " name: pr-7f3k2, uid: u}\nspec:\n  accessModes: [ReadWriteOnce]\n---\n"
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: pvc-f87b6a85f3\n"
        "  namespace: ci\nspec:\n  accessModes: [ReadWriteOnce]\n  volumeName: pv-9\n"
    )
    result = run(
        "explain",
        "-f",
        str(pod_path("tekton-taskrun-two-workspaces")),
        "--mode",
        "pipelineruns",
        "-c",
        str(claims),
        env={"COSCHEDULE_REWRITE_CLAIMS": "true"},  # opt-in
    )
    assert result.returncode == 0, result.stderr
    placeholder = run_placeholder("ci", "pr-7f3k2")
    assert f"rewritten to 'pvc-1f1344866c-{placeholder}-0'" in result.stdout
    assert "claim 'pvc-f87b6a85f3': kept, bound (it may hold data)" in result.stdout


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (["explain", "-f", "/nonexistent/pod.yaml"], None),
        (["explain", "-f", "-"], "kind: Deployment\n"),
        (["explain", "-f", "-"], "{{{{ not yaml"),
        (["explain", "-f", "-"], "- a list\n"),
        (["explain", "-f", "-", "--mode", "sometimes"], "kind: Pod\n"),
        (["explain", "-f", "-"], "kind: Pod\nmetadata: [1]\n"),
    ],
)
def test_explain_unreadable_input_exits_2(args: list[str], stdin: str | None) -> None:
    result = run(*args, stdin=stdin)
    assert result.returncode == 2
    assert "coschedule explain:" in result.stderr


def test_certs_writes_a_tls_secret_folder_and_prints_the_ca_bundle(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    result = run(
        "certs",
        "--dns-name",
        "localhost",
        "--service",
        "coschedule-webhook",
        "--namespace",
        "coschedule-system",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert (out / "tls.key").stat().st_mode & 0o077 == 0
    assert base64.b64decode(result.stdout.strip()) == (out / "ca.crt").read_bytes()
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {
        "localhost",
        "coschedule-webhook",
        "coschedule-webhook.coschedule-system",
        "coschedule-webhook.coschedule-system.svc",
        "coschedule-webhook.coschedule-system.svc.cluster.local",
    }
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca)


def test_certs_without_names_exits_2(tmp_path: Path) -> None:
    result = run("certs", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "--dns-name" in result.stderr


@pytest.mark.parametrize(
    ("args", "prefix"),
    [
        (["reconcile"], "coschedule reconcile:"),
        (
            ["certs", "--dns-name", "a", "--out", "/tmp/x", "--patch-webhook", "w"],
            "coschedule certs:",
        ),
    ],
)
def test_commands_that_need_a_cluster_say_so_and_exit_2(args: list[str], prefix: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert prefix in result.stderr
    assert "needs a cluster" in result.stderr


# ---- rough edges (issue 14.5): a message and exit 2, never a traceback -----------------------


def refused(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


def test_certs_out_on_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("keep me")
    refused(run("certs", "--dns-name", "a", "--out", str(target)), "is a file, not a folder")
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("out", ["{tmp}/a-file/below", "/proc/coschedule-certs"])
def test_certs_out_unwritable_is_refused(tmp_path: Path, out: str) -> None:
    (tmp_path / "a-file").write_text("")
    path = out.format(tmp=tmp_path)
    refused(run("certs", "--dns-name", "a", "--out", path), f"cannot write to --out {path}")


@pytest.mark.parametrize("days", ["0", "-3", "soon", "3651", "100000"])
def test_certs_days_outside_one_to_ten_years_is_refused(tmp_path: Path, days: str) -> None:
    result = run("certs", "--dns-name", "a", "--out", str(tmp_path / "c"), "--days", days)
    refused(result, "argument --days")
    assert not (tmp_path / "c").exists()


def test_certs_days_ten_years_is_taken(tmp_path: Path) -> None:
    result = run("certs", "--dns-name", "a", "--out", str(tmp_path / "c"), "--days", "3650")
    assert result.returncode == 0, result.stderr
    cert = x509.load_pem_x509_certificate((tmp_path / "c" / "tls.crt").read_bytes())
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 3649 <= lifetime.days <= 3650


@pytest.mark.parametrize("command", ["serve", "reconcile"])
def test_bogus_log_level_is_a_usage_error(command: str) -> None:
    refused(run(command, "--log-level", "bogus"), "argument --log-level", "debug, info")


@pytest.mark.parametrize(
    "args",
    [
        ["serve", "--port", "99999"],
        ["serve", "--port", "0"],
        ["serve", "--health-port", "65536"],
        ["reconcile", "--health-port", "-1"],
    ],
)
def test_ports_outside_1_to_65535_are_refused(args: list[str]) -> None:
    refused(run(*args), f"argument {args[1]}", "1..65535")


@pytest.mark.parametrize("value", ["-1s", "10", "ten seconds", "0x"])
def test_a_shutdown_delay_that_is_not_a_duration_is_refused(value: str) -> None:
    refused(run("serve", f"--shutdown-delay={value}"), "argument --shutdown-delay", "or 0")


@pytest.mark.parametrize(
    ("text", "seconds"), [("0", 0.0), ("0s", 0.0), ("10s", 10.0), ("1.5m", 90.0)]
)
def test_a_shutdown_delay_is_a_duration_or_zero(text: str, seconds: float) -> None:
    args = build_parser().parse_args(["serve", "--shutdown-delay", text])
    assert args.shutdown_delay.total_seconds() == seconds


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "kind 'ConfigMap'"),
        ("just some text\n", "a str"),
        ("", "has no objects"),
        ("kind: List\nitems:\n- {kind: Service, metadata: {name: s}}\n", "kind 'Service'"),
    ],
)
def test_explain_claims_file_that_is_not_claims_is_refused(
    tmp_path: Path, content: str, fragment: str
) -> None:
    claims = tmp_path / "claims.yaml"
    claims.write_text(content)
    result = run("explain", "-f", str(pod_path("tekton-taskrun")), "-c", str(claims))
    refused(result, f"cannot read {claims}", fragment)


def test_explain_claims_empty_list_is_fine(tmp_path: Path) -> None:
    claims = tmp_path / "claims.yaml"
    claims.write_text("apiVersion: v1\nkind: List\nitems: []\n")  # kubectl: no PVCs
    result = run("explain", "-f", str(pod_path("tekton-taskrun")), "-c", str(claims))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("command", ["serve", "reconcile", "explain"])
def test_explicit_config_dir_that_is_missing_is_refused(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    extra = ["-f", str(pod_path("tekton-taskrun"))] if command == "explain" else []
    result = run(command, "--config-dir", str(missing), *extra)
    refused(result, f"--config-dir {missing}: no such folder")


def test_version_is_the_package_version() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    result = subprocess.run(
        [str(Path(sys.executable).parent / "coschedule"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"coschedule {version}"


def test_every_flag_has_help() -> None:
    from coschedule.cli.main import build_parser

    parser = build_parser()
    missing = []
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        assert sub.description or any(choice.dest == name for choice in subparsers._choices_actions)
        for action in sub._actions:
            if action.help is None or not action.help.strip():
                missing.append(f"{name} {'/'.join(action.option_strings)}")
    assert missing == []


# ---- mistakes at start answered in one line, exit 2 (issue 21.5) ----------------------------


def _cert_dir(tmp_path: Path, name: str = "good", names: tuple[str, ...] = ("localhost",)) -> Path:
    from coschedule import certs

    folder = tmp_path / name
    certs.write_bundle(certs.generate(list(names)), folder)
    return folder


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return run("serve", "--no-cluster", "--host", "127.0.0.1", *args)


def test_serve_refuses_a_certificate_that_is_not_pem(tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "tls.crt").write_text("junk")
    (folder / "tls.key").write_text("junk")
    refused(
        _serve("--cert-dir", str(folder), "--port", "1", "--health-port", "2"),
        f"cannot serve with {folder}/tls.crt and {folder}/tls.key",
        "not a PEM certificate",
    )


def test_serve_refuses_a_key_of_another_certificate(tmp_path: Path) -> None:
    folder = _cert_dir(tmp_path)
    other = _cert_dir(tmp_path, "other")
    (folder / "tls.key").write_bytes((other / "tls.key").read_bytes())
    refused(
        _serve("--cert-dir", str(folder), "--port", "1", "--health-port", "2"),
        "the key is not the certificate's (a mismatched pair)",
    )


def test_serve_refuses_one_port_for_both_listeners() -> None:
    refused(
        _serve("--port", "9443", "--health-port", "9443"),
        "--port and --health-port are both 9443",
    )


def test_serve_refuses_a_host_that_does_not_resolve() -> None:
    refused(_serve("--host", "no-such-host.invalid"), "--host no-such-host.invalid: not an address")


def _exec_kubeconfig(tmp_path: Path, command: str, *args: str) -> Path:
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": command,
            "args": list(args),
            "interactiveMode": "Never",
        }
    }
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / f"kubeconfig-{Path(command).name}"
    path.write_text(json.dumps(doc))
    return path


PLUGINS = [
    (("no-such-credential-plugin",), "exec plugin no-such-credential-plugin"),
    (("/bin/sh", "-c", "echo denied >&2; exit 3"), "exec plugin /bin/sh exited 3: denied"),
    (("/bin/echo", "junk"), "exec plugin /bin/echo: output is not JSON"),
]


@pytest.mark.parametrize(("plugin", "fragment"), PLUGINS)
def test_a_broken_exec_plugin_is_one_line_for_every_command(
    tmp_path: Path, plugin: tuple[str, ...], fragment: str
) -> None:
    kubeconfig = str(_exec_kubeconfig(tmp_path, *plugin))
    certs_dir = str(_cert_dir(tmp_path))
    serve = run(
        "serve", "--kubeconfig", kubeconfig, "--cert-dir", certs_dir, "--host", "127.0.0.1",
        "--port", "1", "--health-port", "2",
    )  # fmt: skip
    refused(serve, "coschedule serve: kubeconfig", fragment)
    reconcile = run("reconcile", "--kubeconfig", kubeconfig, "--health-port", "3")
    refused(reconcile, "coschedule reconcile: kubeconfig", fragment)
    apply = run(
        "certs", "--dns-name", "a", "--out", str(tmp_path / "c"), "--kubeconfig", kubeconfig,
        "--apply-to-secret", "ns/name",
    )  # fmt: skip
    refused(apply, "coschedule certs: kubeconfig", fragment)


@pytest.mark.parametrize(
    ("names", "fragment"),
    [
        (("",), "an empty name"),
        (("a" * 40 + "." + "b" * 40 + ".com",), "the first name is the certificate's common name"),
        (("bad_name",), "'bad_name' is neither a DNS name nor an IP address"),
        (("ok.example.com", "x" * 64 + ".com"), "is neither a DNS name"),
        (("ok.example.com", "two words"), "'two words' is neither"),
    ],
)
def test_certs_refuses_names_no_certificate_can_carry(
    tmp_path: Path, names: tuple[str, ...], fragment: str
) -> None:
    args = [arg for name in names for arg in ("--dns-name", name)]
    refused(run("certs", *args, "--out", str(tmp_path / "c")), fragment)
    assert not (tmp_path / "c").exists()


def test_certs_takes_long_names_after_a_short_first_and_ip_addresses_and_wildcards(
    tmp_path: Path,
) -> None:
    names = ("webhook.example.com", "a" * 40 + "." + "b" * 40 + ".com", "*.svc.local", "::1")
    args = [arg for name in names for arg in ("--dns-name", name)]
    result = run("certs", *args, "--out", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "c" / "tls.crt").is_file()


# ---- messages that say what is wrong (issue 21.8) ------------------------------------------


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        (("serve", "--bogus"), "usage: coschedule serve"),
        (("certs", "--dns-name", "a", "--bogus", "x"), "usage: coschedule certs"),
        (("explain", "-f", "x.yaml", "--bogus"), "usage: coschedule explain"),
        (("reconcile", "--bogus"), "usage: coschedule reconcile"),
    ],
)
def test_an_unknown_flag_after_a_command_prints_that_commands_usage(
    command: tuple[str, ...], usage: str
) -> None:
    result = run(*command)
    refused(result, usage, "unrecognized arguments: --bogus")


def test_a_file_given_for_a_folder_is_named_as_such(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    refused(
        run("explain", "-f", str(pod_path("tekton-taskrun")), "--config-dir", str(a_file)),
        f"--config-dir {a_file} is a file, not a folder",
    )
    refused(
        run(
            "serve", "--no-cluster", "--cert-dir", str(a_file), "--port", "1", "--health-port", "2"
        ),
        f"--cert-dir {a_file} is a file, not a folder",
    )


def test_help_states_every_flags_default() -> None:
    """A flag with a default value says it in --help ((default: ...) or in words)."""
    import argparse

    from coschedule.cli.main import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    checked = 0
    for name, command in commands.choices.items():
        for action in command._actions:
            if action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
                continue
            shown = command._get_formatter()._format_action(action)  # as --help prints it
            flag = action.option_strings[-1]
            assert "default" in shown, f"coschedule {name} {flag}: no default in --help"
            checked += 1
    assert checked >= 12


def test_explain_shows_the_isolation_scope_why_and_the_placeholders_terms(
    tmp_path: Path,
) -> None:
    (tmp_path / "coschedule").write_text("isolate-pipelinerun")
    (tmp_path / "isolation-scope").write_text("tenant")
    (tmp_path / "isolation-tenant-label").write_text("example.com/team")
    result = run(
        "explain",
        "-f",
        str(pod_path("tekton-taskrun-no-workspace")),
        "--config-dir",
        str(tmp_path),
        "--namespace-label",
        "example.com/team=payments",
        "-o",
        "json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    isolated = report["isolation"]
    assert isolated["scope"] == "tenant"
    assert isolated["tenant"] == "payments"
    assert isolated["from"] == 'cluster config "isolation-scope: tenant"'
    own, others = isolated["placeholderAntiAffinity"]
    assert "namespaceSelector" not in own
    assert others["namespaceSelector"] == {}
    assert others["labelSelector"]["matchExpressions"][0]["values"] == ["payments"]
    assert "tenant 'payments': the namespace's label example.com/team" in report["reasons"]

    # A namespace label that Kubernetes' rule forbids with a zone key: denied, saying so.
    (tmp_path / "isolation-scope").write_text("namespace")
    (tmp_path / "topology-key").write_text("topology.kubernetes.io/zone")
    result = run(
        "explain",
        "-f",
        str(pod_path("tekton-taskrun-no-workspace")),
        "--config-dir",
        str(tmp_path),
        "--namespace-label",
        "coschedule.dev/isolation-scope=cluster",
    )
    assert result.returncode == 0, result.stderr
    assert "DENIED" in result.stdout
    assert "rule invalid-isolation-scope" in result.stdout
    assert "Fix: set the label to namespace, or remove it." in result.stdout


def test_explain_refuses_a_namespace_label_without_a_value() -> None:
    result = run(
        "explain", "-f", str(pod_path("tekton-taskrun")), "--namespace-label", "example.com/team"
    )
    assert result.returncode == 2
    assert "is not KEY=VALUE" in result.stderr
