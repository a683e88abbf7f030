#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The deployment files against the settings table of the built binary:
# - every OUTBOX_* name in the Dockerfile, compose file, Kubernetes
#   manifests, systemd unit and env file and docs/deployment.md is a
#   setting the binary knows (NAME_FILE and OUTBOX_KAFKA_<PROPERTY> count);
# - each way of running the relay (Kubernetes Deployment, compose replicas,
#   systemd unit) sets the database URL, the publisher and the publisher's
#   broker address, and its migration sets the database URL and the same
#   table; *_FILE paths name keys the mounted Secret or credentials have;
# - every stop grace period is at least OUTBOX_SHUTDOWN_TIMEOUT + 5 s;
# - the binary accepts each environment: with the hosts pointed at a closed
#   loopback port, `check` (relays) and `migrate` (migrations) exit 1, a
#   connection failure, never 2, a configuration error.
# Needs no running service.
set -euo pipefail

: "${RELAY_TEST_BIN:?run through meson test (tests/run.sh)}"
root=${RELAY_TEST_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-deploy-settings.XXXXXX")
trap 'rm -rf "$work"' EXIT

failures=0
fail() {
	echo "FAIL: $*" >&2
	failures=$((failures + 1))
}

cd "$root"
files=(
	deploy/Dockerfile
	deploy/docker-compose.yml
	deploy/kubernetes/*.yaml
	deploy/systemd/outbox-relay.service
	deploy/systemd/outbox-relay.env
	docs/deployment.md
)
for f in "${files[@]}"; do
	[ -f "$f" ] || fail "missing $f"
done

# The settings table, from the binary itself: name and default per row.
"$RELAY_TEST_BIN" --settings-markdown >"$work/settings.md"
# shellcheck disable=SC2016 # the backquotes are Markdown
sed -n 's/^| `\(OUTBOX_[A-Z0-9_]*\)` | \(`\([^`]*\)`\|unset\) |.*/\1=\3/p' \
	"$work/settings.md" >"$work/defaults"
cut -d= -f1 "$work/defaults" >"$work/known"
if ! grep -qx OUTBOX_DATABASE_URL "$work/known" || ! grep -qx OUTBOX_SHUTDOWN_TIMEOUT "$work/known"; then
	echo "FAIL: cannot read the settings table from $RELAY_TEST_BIN --settings-markdown" >&2
	exit 1
fi

# known NAME: a setting, NAME_FILE of one, or a Kafka property.
known() {
	local name="${1%_FILE}"
	grep -qx "$name" "$work/known" && return 0
	case "$name" in
	OUTBOX_KAFKA_?*) return 0 ;;
	esac
	return 1
}

for f in "${files[@]}"; do
	[ -f "$f" ] || continue
	while IFS= read -r name; do
		case "$name" in
		# "OUTBOX_*" and "OUTBOX_KAFKA_<PROPERTY>" in prose name families.
		OUTBOX_ | OUTBOX_KAFKA_) continue ;;
		*_) fail "$f: '$name' looks like a prefix of a setting that does not exist" ;;
		*) known "$name" || fail "$f: $name is not a setting of outbox-relay" ;;
		esac
	done < <(grep -o 'OUTBOX_[A-Z0-9_]*' "$f" | sort -u)
done

pick_python() {
	local py
	for py in python3 /usr/bin/python3; do
		if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import yaml' 2>/dev/null; then
			echo "$py"
			return
		fi
	done
	echo "FAIL: no python3 with PyYAML (Debian package python3-yaml)" >&2
	exit 1
}
python=$(pick_python)

# Writes one environment per way of running the relay to $work/env/NAME
# (NAME=value lines; *_FILE values point at files under $work/files with
# the Secret's or a stand-in's content), with every host rewritten to
# 127.0.0.1:1. Checks as it goes what needs the parsed files.
mkdir -p "$work/env" "$work/files"
"$python" - "$work" <<'PY' || failures=$((failures + $?))
import os
import re
import sys
import urllib.parse

import yaml

work = sys.argv[1]
problems = []
defaults = dict(l.rstrip("\n").split("=", 1) for l in open(f"{work}/defaults"))


def problem(msg):
    problems.append(msg)


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def seconds(text, what):
    """Duration as the relay reads it (500ms, 2s, 1m, 1h, 7d) -> seconds."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text)
    if text == "0":
        return 0
    if not m:
        problem(f"{what}: '{text}' is not a relay duration")
        return 0
    n, unit = int(m.group(1)), m.group(2)
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


def span_seconds(text, units, what):
    """A sequence like 1m30s (Go, compose) or '1min 30s' (systemd)."""
    text = str(text).strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    parts = re.findall(r"(\d+)\s*([a-z]+)", text)
    if (re.fullmatch(r"(\d+\s*[a-z]+\s*)+", text)
            and all(unit in units for _, unit in parts)):
        return sum(int(n) * units[unit] for n, unit in parts)
    problem(f"{what}: cannot read duration '{text}'")
    return 0


GO_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
SYSTEMD_UNITS = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60,
                 "h": 3600, "hr": 3600}


def closed_port_url(url):
    """The same URL aimed at 127.0.0.1:1, so nothing leaves loopback."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme or not parts.netloc:
        problem(f"'{url}' is not a URL with a host")
        return url
    user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urllib.parse.urlunsplit(
        (parts.scheme, user + "127.0.0.1:1", parts.path, parts.query, ""))


URL_SETTINGS = ("OUTBOX_DATABASE_URL", "OUTBOX_LISTEN_DATABASE_URL",
                "OUTBOX_AMQP_URL")


def aim_at_loopback(name, value):
    base = name[:-5] if name.endswith("_FILE") else name
    if base in URL_SETTINGS and value:
        return closed_port_url(value)
    if base == "OUTBOX_KAFKA_BROKERS" and value:
        return "127.0.0.1:1"
    return value


file_count = 0


def write_file(setname, name, content):
    global file_count
    file_count += 1
    path = f"{work}/files/{setname}-{file_count}"
    with open(path, "w") as f:
        f.write(aim_at_loopback(name, content) + "\n")
    return path


def require(setname, kind, env):
    def has(name):
        return env.get(name) or env.get(name + "_FILE")

    if not has("OUTBOX_DATABASE_URL"):
        problem(f"{setname}: sets neither OUTBOX_DATABASE_URL nor OUTBOX_DATABASE_URL_FILE")
    if kind != "relay":
        return
    publisher = env.get("OUTBOX_PUBLISHER")
    if not publisher:
        problem(f"{setname}: OUTBOX_PUBLISHER is not set")
    broker = {"amqp": "OUTBOX_AMQP_URL", "kafka": "OUTBOX_KAFKA_BROKERS"}
    if publisher in broker and not has(broker[publisher]):
        problem(f"{setname}: publisher {publisher} without {broker[publisher]}")


def table_of(env):
    return env.get("OUTBOX_TABLE") or defaults["OUTBOX_TABLE"]


def shutdown_seconds(setname, env):
    return seconds(env.get("OUTBOX_SHUTDOWN_TIMEOUT")
                   or defaults["OUTBOX_SHUTDOWN_TIMEOUT"],
                   f"{setname}: OUTBOX_SHUTDOWN_TIMEOUT")


def emit(setname, kind, env):
    require(setname, kind, env)
    with open(f"{work}/env/{setname}.{kind}", "w") as f:
        for name, value in sorted(env.items()):
            if "\n" in value:
                problem(f"{setname}: {name} holds a newline")
                continue
            if not name.endswith("_FILE"):
                value = aim_at_loopback(name, value)
            f.write(f"{name}={value}\n")


# --- Kubernetes ------------------------------------------------------------
k8s = {}
for fn in sorted(os.listdir("deploy/kubernetes")):
    if fn.endswith(".yaml") and fn != "kustomization.yaml":
        for doc in load_all(f"deploy/kubernetes/{fn}"):
            k8s[(doc["kind"], doc["metadata"]["name"])] = (fn, doc)


def k8s_env(setname, fn, pod):
    """The environment of the pod's first container, Secrets resolved."""
    spec = pod["spec"]
    container = spec["containers"][0]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {m["mountPath"].rstrip("/"): volumes.get(m["name"])
              for m in container.get("volumeMounts", [])}
    env = {}
    for src in container.get("envFrom", []):
        ref = src.get("configMapRef", {}).get("name")
        cm = k8s.get(("ConfigMap", ref))
        if not cm:
            problem(f"{fn}: envFrom names ConfigMap '{ref}', which is not in deploy/kubernetes")
            continue
        for name, value in cm[1].get("data", {}).items():
            if not isinstance(value, str):
                problem(f"{cm[0]}: {name} is {type(value).__name__}, not a string; quote it")
            env[name] = str(value)
    for e in container.get("env", []):
        name = e["name"]
        if "value" in e:
            if not isinstance(e["value"], str):
                problem(f"{fn}: env {name} is not a string; quote it")
            env[name] = str(e["value"])
        elif "configMapKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["configMapKeyRef"]
            cm = k8s.get(("ConfigMap", ref["name"]))
            if not cm or ref["key"] not in cm[1].get("data", {}):
                problem(f"{fn}: {name} names key {ref['key']} of ConfigMap {ref['name']}, which does not exist")
                continue
            env[name] = str(cm[1]["data"][ref["key"]])
        else:
            problem(f"{fn}: {name}: only value and configMapKeyRef are expected; secrets go through *_FILE")
    for name in list(env):
        if not name.endswith("_FILE"):
            continue
        path = env[name]
        directory, key = os.path.split(path)
        volume = mounts.get(directory)
        if not volume or "secret" not in volume:
            problem(f"{fn}: {name}={path} is not a file of a mounted Secret volume")
            continue
        secret_name = volume["secret"]["secretName"]
        secret = k8s.get(("Secret", secret_name))
        if not secret:
            problem(f"{fn}: Secret {secret_name} is not in deploy/kubernetes")
            continue
        data = secret[1].get("stringData", {})
        if key not in data:
            problem(f"{fn}: {name} reads key '{key}', which Secret {secret_name} ({secret[0]}) lacks")
            continue
        env[name] = write_file(setname, name, data[key])
    return env


deployment = k8s.get(("Deployment", "outbox-relay"))
job = k8s.get(("Job", "outbox-relay-migrate"))
if not deployment or not job:
    problem("deploy/kubernetes: Deployment outbox-relay or Job outbox-relay-migrate missing")
else:
    relay_env = k8s_env("kubernetes-relay", deployment[0], deployment[1]["spec"]["template"])
    migrate_env = k8s_env("kubernetes-migrate", job[0], job[1]["spec"]["template"])
    emit("kubernetes-relay", "relay", relay_env)
    emit("kubernetes-migrate", "migrate", migrate_env)
    if table_of(relay_env) != table_of(migrate_env):
        problem(f"kubernetes: the Job migrates {table_of(migrate_env)}, the relay reads {table_of(relay_env)}")
    grace = deployment[1]["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    need = shutdown_seconds("kubernetes-relay", relay_env) + 5
    if grace < need:
        problem(f"{deployment[0]}: terminationGracePeriodSeconds {grace} < OUTBOX_SHUTDOWN_TIMEOUT + 5 s = {need:g}")

# --- Compose ---------------------------------------------------------------
with open("deploy/docker-compose.yml") as f:
    compose = yaml.safe_load(f)
services = compose.get("services", {})


def compose_env(name):
    env = {}
    for key, value in (services[name].get("environment") or {}).items():
        if not isinstance(value, str):
            problem(f"docker-compose.yml: {name}: {key} is not a string; quote it")
        if key.startswith("OUTBOX_"):
            env[key] = str(value).replace("$$", "$")
    return env


relays = [n for n, s in services.items() if s.get("command") == ["run"]]
migrates = [n for n, s in services.items() if s.get("command") == ["migrate"]]
if len(relays) < 2 and not any(services[n].get("deploy", {}).get("replicas", 1) >= 2 for n in relays):
    problem(f"docker-compose.yml: want two relay replicas, found {relays}")
if len(migrates) != 1:
    problem(f"docker-compose.yml: want one migrate service, found {migrates}")
tables = set()
for name in relays:
    env = compose_env(name)
    emit(f"compose-{name}", "relay", env)
    tables.add(table_of(env))
    deps = services[name].get("depends_on", {})
    for m in migrates:
        if deps.get(m, {}).get("condition") != "service_completed_successfully":
            problem(f"docker-compose.yml: {name} must wait for {m} (service_completed_successfully)")
    # Docker's default is 10 s, less than the relay's default drain.
    grace = span_seconds(services[name].get("stop_grace_period", "10s"), GO_UNITS,
                         f"docker-compose.yml: {name}: stop_grace_period")
    need = shutdown_seconds(f"compose-{name}", env) + 5
    if grace < need:
        problem(f"docker-compose.yml: {name}: stop_grace_period {grace:g}s < OUTBOX_SHUTDOWN_TIMEOUT + 5 s = {need:g}s")
for name in migrates:
    env = compose_env(name)
    emit(f"compose-{name}", "migrate", env)
    tables.add(table_of(env))
if len(tables) != 1:
    problem(f"docker-compose.yml: relays and migrate disagree on OUTBOX_TABLE: {sorted(tables)}")
producer = services.get("producer", {})
script = "\n".join(producer.get("command") or [])
for table in tables:
    helper = table.split(".")[-1] + "_enqueue_json("
    if helper not in script:
        problem(f"docker-compose.yml: the producer does not call {helper}...) of table {table}")
if not re.search(r"^BEGIN;.*^INSERT INTO .*enqueue_json\(.*^COMMIT;", script, re.S | re.M):
    problem("docker-compose.yml: the producer must insert its domain row and event between BEGIN; and COMMIT;")

# --- systemd ---------------------------------------------------------------
unit_env, credentials, env_files = {}, {}, []
timeout_stop = None
for line in open("deploy/systemd/outbox-relay.service"):
    line = line.strip()
    if line.startswith("Environment="):
        name, _, value = line[len("Environment="):].partition("=")
        unit_env[name] = value
    elif line.startswith("EnvironmentFile="):
        env_files.append(line[len("EnvironmentFile="):].lstrip("-"))
    elif line.startswith("LoadCredential="):
        cred, _, src = line[len("LoadCredential="):].partition(":")
        credentials[cred] = src
    elif line.startswith("TimeoutStopSec="):
        timeout_stop = line[len("TimeoutStopSec="):]
env = {}
for path in env_files:
    example = "deploy/systemd/" + os.path.basename(path)
    if not os.path.isfile(example):
        problem(f"outbox-relay.service: EnvironmentFile {path} has no example at {example}")
        continue
    for line in open(example):
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name] = value
env.update(unit_env)
# Stand-ins for the credential files, whose real content is secret.
stand_in = {"OUTBOX_DATABASE_URL": "postgresql://outbox_relay:secret@db.example.internal:5432/app",
            "OUTBOX_AMQP_URL": "amqps://outbox-relay:secret@mq.example.internal:5671",
            "OUTBOX_KAFKA_BROKERS": "kafka.example.internal:9093"}
for name in list(env):
    value = env[name]
    if not value.startswith("%d/"):
        continue
    cred = value[3:]
    if cred not in credentials:
        problem(f"outbox-relay.service: {name} reads credential '{cred}', which no LoadCredential= provides")
        continue
    env[name] = write_file("systemd", name, stand_in.get(name[:-5], "stand-in"))
emit("systemd", "relay", env)
need = shutdown_seconds("systemd", env) + 5
stop = span_seconds(timeout_stop or "90s", SYSTEMD_UNITS, "outbox-relay.service: TimeoutStopSec")
if stop < need:
    problem(f"outbox-relay.service: TimeoutStopSec {stop:g}s < OUTBOX_SHUTDOWN_TIMEOUT + 5 s = {need:g}s")

for p in problems:
    print(f"FAIL: {p}", file=sys.stderr)
sys.exit(min(len(problems), 100))
PY

# Every environment must name only known settings and pass the binary's
# validation: exit 1 (nothing listens on port 1), not 2.
shopt -s nullglob
envs=("$work"/env/*)
[ ${#envs[@]} -ge 5 ] || fail "expected at least 5 environments (2 Kubernetes, 3 compose, 1 systemd), got ${#envs[@]}"
for envfile in "${envs[@]}"; do
	set_name=$(basename "$envfile")
	kind=${set_name##*.}
	vars=()
	while IFS= read -r line; do
		known "${line%%=*}" || fail "$set_name: ${line%%=*} is not a setting"
		vars+=("$line")
	done <"$envfile"
	if [ "$kind" = relay ]; then cmd=check; else cmd=migrate; fi
	# The sanitizer settings of the test build stay; nothing else does.
	for san in ASAN_OPTIONS UBSAN_OPTIONS; do
		[ -z "${!san:-}" ] || vars+=("$san=${!san}")
	done
	rc=0
	env -i PATH=/usr/bin:/bin "${vars[@]}" timeout 60 "$RELAY_TEST_BIN" "$cmd" \
		>"$work/$set_name.out" 2>&1 || rc=$?
	if [ "$rc" -ne 1 ]; then
		fail "$set_name: \`outbox-relay $cmd\` exited $rc, want 1 (a connection failure):"
		sed 's/^/    /' "$work/$set_name.out" >&2
	elif grep -q '^config: [A-Z]' "$work/$set_name.out"; then
		fail "$set_name: configuration problems reported:"
		sed 's/^/    /' "$work/$set_name.out" >&2
	elif [ "$cmd" = check ] && ! grep -qx 'config: ok' "$work/$set_name.out"; then
		fail "$set_name: \`outbox-relay check\` did not report 'config: ok':"
		sed 's/^/    /' "$work/$set_name.out" >&2
	fi
done

if [ "$failures" -gt 0 ]; then
	echo "deploy_settings: $failures problem(s)" >&2
	exit 1
fi
echo "deploy_settings: ${#envs[@]} environments and ${#files[@]} files agree with the settings table"
