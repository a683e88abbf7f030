#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The deployment files are well formed and agree with the build and with
# each other (no Docker engine or cluster needed):
# - the compose file and the manifests pass yamllint --strict with
#   deploy/.yamllint;
# - the Dockerfile's build stage installs with deploy/install-deps.sh
#   --only build (the script tests/run.sh calls), builds a meson release
#   and runs the unit suite; its runtime stage installs exactly the
#   packages providing the libraries the binary links (plus tini,
#   ca-certificates and curl for the healthcheck), runs as a numeric
#   non-root user under tini, stops with SIGTERM and checks /healthz on
#   the default HTTP port;
# - the Kubernetes manifests: kustomization lists every manifest; the
#   Deployment probes /healthz and /readyz on its HTTP port, is hardened,
#   has resources and runs the Dockerfile's UID; the PodDisruptionBudget
#   and the metrics Service select the relay pods and not the migrate
#   Job's; the Job uses its own Secret; images carry the binary's version;
#   the NetworkPolicy admits only the HTTP port, from the cluster only,
#   and lets the pods reach DNS, Postgres and the broker ports; the Job
#   takes the relays' ConfigMap;
# - compose relays are hardened like the pods and share one image, and
#   the migrate service takes their settings;
# - the systemd unit passes systemd-analyze verify and is hardened;
# - every deploy/ path named in docs/deployment.md exists.
set -euo pipefail

: "${RELAY_TEST_BIN:?run through meson test (tests/run.sh)}"
root=${RELAY_TEST_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-deploy-files.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$root"

failures=0
fail() {
	echo "FAIL: $*" >&2
	failures=$((failures + 1))
}

# --- YAML ------------------------------------------------------------------
if ! yamllint --strict -f parsable -c deploy/.yamllint \
	deploy/.yamllint deploy/docker-compose.yml deploy/kubernetes >"$work/yamllint.out" 2>&1; then
	fail "yamllint:"
	sed 's/^/    /' "$work/yamllint.out" >&2
fi

# --- The build is the test command's build ----------------------------------
grep -q 'deploy/install-deps\.sh' tests/run.sh ||
	fail "tests/run.sh no longer calls deploy/install-deps.sh"

# --- Dockerfile, manifests, compose: parsed in Python ----------------------
"$RELAY_TEST_BIN" --settings-markdown >"$work/settings.md"
version=$("$RELAY_TEST_BIN" --version | awk '{ print $2 }')
[ -n "$version" ] || fail "no version from $RELAY_TEST_BIN --version"

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

# Writes the runtime stage's package list to $work/runtime-packages.
"$python" - "$work" "$version" <<'PY' || failures=$((failures + $?))
import json
import os
import re
import shlex
import sys

import yaml

work, version = sys.argv[1], sys.argv[2]
problems = []


def problem(msg):
    problems.append(msg)


settings = open(f"{work}/settings.md").read()
m = re.search(r"^\| `OUTBOX_HTTP_ADDR` \| `[^`]*:(\d+)` \|", settings, re.M)
default_port = int(m.group(1)) if m else None
if default_port is None:
    problem("no default OUTBOX_HTTP_ADDR port in the settings table")

# --- Dockerfile ------------------------------------------------------------
instructions = []
pending = ""
for raw in open("deploy/Dockerfile"):
    line = raw.rstrip("\n")
    if not pending and (line.lstrip().startswith("#") or not line.strip()):
        continue
    if line.endswith("\\"):
        pending += line[:-1] + " "
        continue
    line = pending + line
    pending = ""
    word, _, rest = line.strip().partition(" ")
    instructions.append((word.upper(), rest.strip()))

stages = []
for word, rest in instructions:
    if word == "FROM":
        stages.append({"from": rest, "ins": []})
    elif stages:
        stages[-1]["ins"].append((word, rest))
if len(stages) != 2:
    problem(f"Dockerfile: want 2 stages (build, runtime), found {len(stages)}")
    stages += [{"from": "", "ins": []}] * (2 - len(stages))
build, runtime = stages[0], stages[-1]


def runs(stage):
    return " ".join(rest for word, rest in stage["ins"] if word == "RUN")


def one(stage, word):
    found = [rest for w, rest in stage["ins"] if w == word]
    return found[-1] if found else None


for stage, name in ((build, "build"), (runtime, "runtime")):
    if not re.match(r"debian:bookworm(-slim)?\b", stage["from"]):
        problem(f"Dockerfile: the {name} stage is not Debian bookworm: FROM {stage['from']}")
if not re.search(r"\bAS build$", build["from"], re.I):
    problem("Dockerfile: the first stage is not named 'build'")
for needle in ("deploy/install-deps.sh --only build",
               "meson setup build --buildtype=release",
               "ninja -C build",
               "meson test -C build --suite unit"):
    if needle not in runs(build):
        problem(f"Dockerfile: the build stage does not run '{needle}'")

packages = []
for cmd in re.split(r"&&|;", runs(runtime)):
    words = shlex.split(cmd)
    if "apt-get" in words and "install" in words:
        packages += [w for w in words[words.index("install") + 1:]
                     if not w.startswith("-")]
with open(f"{work}/runtime-packages", "w") as f:
    f.write("".join(p + "\n" for p in packages))
for p in packages:
    if p.endswith("-dev"):
        problem(f"Dockerfile: the runtime stage installs the development package {p}")
for p in ("tini", "ca-certificates"):
    if p not in packages:
        problem(f"Dockerfile: the runtime stage lacks {p}")
copies = [rest for w, rest in runtime["ins"] if w == "COPY"]
sources = sorted(c.split()[1] for c in copies if c.startswith("--from=build"))
if sources != ["/src/build/outbox-relay", "/src/sql/*.sql"] or len(copies) != 2:
    problem(f"Dockerfile: the runtime stage must copy only the binary and sql/*.sql, copies {copies}")

uid = None
user = one(runtime, "USER") or ""
m = re.fullmatch(r"(\d+)(?::(\d+))?", user)
if not m or int(m.group(1)) == 0:
    problem(f"Dockerfile: USER must be a numeric non-root UID, is '{user}'")
else:
    uid = int(m.group(1))
    if f"--uid {uid}" not in runs(runtime):
        problem(f"Dockerfile: USER {uid} is not the UID the image creates")
entry = one(runtime, "ENTRYPOINT")
if entry is None or json.loads(entry) != ["/usr/bin/tini", "--", "outbox-relay"]:
    problem(f"Dockerfile: ENTRYPOINT is {entry}, want [\"/usr/bin/tini\", \"--\", \"outbox-relay\"]")
cmd = one(runtime, "CMD")
if cmd is None or json.loads(cmd) != ["run"]:
    problem(f"Dockerfile: CMD is {cmd}, want [\"run\"]")
if one(runtime, "STOPSIGNAL") != "SIGTERM":
    problem("Dockerfile: STOPSIGNAL is not SIGTERM")
if one(runtime, "EXPOSE") != str(default_port):
    problem(f"Dockerfile: EXPOSE {one(runtime, 'EXPOSE')}, the default HTTP port is {default_port}")
health = one(runtime, "HEALTHCHECK") or ""
if "/healthz" not in health or f"0.0.0.0:{default_port}" not in health:
    problem("Dockerfile: HEALTHCHECK does not check /healthz on the default OUTBOX_HTTP_ADDR")
if "curl" in health and "curl" not in packages:
    problem("Dockerfile: HEALTHCHECK uses curl, which the runtime stage does not install")

# --- Kubernetes ------------------------------------------------------------
kdir = "deploy/kubernetes"
kust = yaml.safe_load(open(f"{kdir}/kustomization.yaml"))
manifests = sorted(f for f in os.listdir(kdir)
                   if f.endswith(".yaml") and f != "kustomization.yaml")
if sorted(kust.get("resources", [])) != manifests:
    problem(f"kustomization.yaml lists {sorted(kust.get('resources', []))}, the directory holds {manifests}")
objs = {}
for fn in manifests:
    for doc in yaml.safe_load_all(open(f"{kdir}/{fn}")):
        if doc:
            objs.setdefault(doc["kind"], []).append(doc)
for kind in ("Deployment", "ConfigMap", "Secret", "Job",
             "PodDisruptionBudget", "Service", "NetworkPolicy"):
    if kind not in objs:
        problem(f"{kdir}: no {kind}")
        objs[kind] = [{"metadata": {"name": "?"}, "spec": {}}]


def get(d, *path, default=None):
    for p in path:
        if isinstance(d, list) and isinstance(p, int) and p < len(d):
            d = d[p]
        elif isinstance(d, dict) and p in d:
            d = d[p]
        else:
            return default
    return d


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_pod_hardening(what, pod):
    spec = pod.get("spec", {})
    psc = spec.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True:
        problem(f"{what}: pod securityContext.runAsNonRoot is not true")
    if uid is not None and psc.get("runAsUser") != uid:
        problem(f"{what}: runAsUser {psc.get('runAsUser')} is not the image's UID {uid}")
    if spec.get("enableServiceLinks") is not False:
        problem(f"{what}: enableServiceLinks must be false (service links inject OUTBOX_* variables)")
    if spec.get("automountServiceAccountToken") is not False:
        problem(f"{what}: automountServiceAccountToken should be false; the relay never calls the API")
    for c in spec.get("containers", []):
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            problem(f"{what}: container {c['name']}: allowPrivilegeEscalation is not false")
        if sc.get("readOnlyRootFilesystem") is not True:
            problem(f"{what}: container {c['name']}: readOnlyRootFilesystem is not true")
        if get(sc, "capabilities", "drop") != ["ALL"]:
            problem(f"{what}: container {c['name']}: capabilities do not drop ALL")
        for part in ("requests", "limits"):
            for res in ("cpu", "memory"):
                if get(c, "resources", part, res) is None:
                    problem(f"{what}: container {c['name']}: no resources.{part}.{res}")
        image = c.get("image", "")
        if image.rsplit(":", 1)[-1] != version:
            problem(f"{what}: image {image} is not tagged with the binary's version {version}")


dep = objs["Deployment"][0]
job = objs["Job"][0]
dep_pod = get(dep, "spec", "template", default={})
job_pod = get(job, "spec", "template", default={})
dep_labels = get(dep_pod, "metadata", "labels", default={})
job_labels = get(job_pod, "metadata", "labels", default={})
check_pod_hardening("Deployment", dep_pod)
check_pod_hardening("Job", job_pod)
if (get(dep, "spec", "replicas") or 1) < 2:
    problem("Deployment: fewer than 2 replicas")
if not selects(get(dep, "spec", "selector", "matchLabels"), dep_labels):
    problem("Deployment: selector does not match its pod labels")

relay = get(dep_pod, "spec", "containers", 0, default={})
config_map = objs["ConfigMap"][0].get("data", {})
addr = config_map.get("OUTBOX_HTTP_ADDR", f"0.0.0.0:{default_port}")
http_port = int(addr.rsplit(":", 1)[1]) if ":" in addr else None
ports = {p.get("name"): p.get("containerPort") for p in relay.get("ports", [])}
if http_port not in ports.values():
    problem(f"Deployment: no containerPort {http_port} (OUTBOX_HTTP_ADDR {addr})")
for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
    get_ = get(relay, probe, "httpGet", default={})
    port = get_.get("port")
    port = ports.get(port, port)
    if get_.get("path") != path or port != http_port:
        problem(f"Deployment: {probe} is not GET {path} on port {http_port}")
for secret_var in ("OUTBOX_DATABASE_URL", "OUTBOX_AMQP_URL", "OUTBOX_LISTEN_DATABASE_URL"):
    if secret_var in config_map:
        problem(f"ConfigMap: {secret_var} is a secret; pass it as {secret_var}_FILE from the Secret")
env_names = {e["name"] for e in relay.get("env", [])}
for need in ("OUTBOX_DATABASE_URL_FILE", "OUTBOX_AMQP_URL_FILE"):
    if need not in env_names:
        problem(f"Deployment: {need} is not set")


def secret_volumes(pod):
    return {get(v, "secret", "secretName") for v in get(pod, "spec", "volumes", default=[])
            if "secret" in v}


if secret_volumes(dep_pod) & secret_volumes(job_pod):
    problem("Job: shares a Secret with the relay; migrations run with the table owner's role")
if get(job_pod, "spec", "containers", 0, "args") != ["migrate"]:
    problem("Job: the container does not run `migrate`")
job_maps = {get(e, "configMapRef", "name")
            for e in get(job_pod, "spec", "containers", 0, "envFrom", default=[])}
relay_maps = {get(e, "configMapRef", "name") for e in relay.get("envFrom", [])}
if not relay_maps or not relay_maps <= job_maps:
    problem("Job: does not take the relays' ConfigMap; migrate makes the table "
            "match their settings (OUTBOX_LISTEN, OUTBOX_RETENTION)")

pdb = objs["PodDisruptionBudget"][0]
if get(pdb, "spec", "minAvailable") != 1:
    problem("PodDisruptionBudget: minAvailable is not 1")
if get(pdb, "spec", "unhealthyPodEvictionPolicy") != "AlwaysAllow":
    problem("PodDisruptionBudget: replicas made unready by a database "
            "outage would block node drains (unhealthyPodEvictionPolicy)")
pdb_sel = get(pdb, "spec", "selector", "matchLabels")
if not selects(pdb_sel, dep_labels) or selects(pdb_sel, job_labels):
    problem("PodDisruptionBudget: must select the relay pods and not the migrate Job's")

svc = objs["Service"][0]
svc_sel = get(svc, "spec", "selector")
if not selects(svc_sel, dep_labels) or selects(svc_sel, job_labels):
    problem("Service: must select the relay pods and not the migrate Job's")
ann = get(svc, "metadata", "annotations", default={})
svc_ports = get(svc, "spec", "ports", default=[])
if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/path") != "/metrics" \
        or ann.get("prometheus.io/port") != str(http_port):
    problem(f"Service: prometheus.io annotations must scrape /metrics on {http_port}")
target = get(svc_ports, 0, "targetPort")
if ports.get(target, target) != http_port:
    problem(f"Service: targetPort {target} is not the relay's HTTP port {http_port}")
# NetworkPolicy: the relay pods take traffic on their HTTP port only, and
# only from the cluster; they may reach DNS, Postgres and the brokers.
netpol = objs["NetworkPolicy"][0]
if not selects(get(netpol, "spec", "podSelector", "matchLabels"), dep_labels):
    problem("NetworkPolicy: does not select the relay pods")
if sorted(get(netpol, "spec", "policyTypes", default=[])) != ["Egress", "Ingress"]:
    problem("NetworkPolicy: policyTypes must be Ingress and Egress")
ingress = get(netpol, "spec", "ingress", default=[])
if not ingress:
    problem("NetworkPolicy: no ingress rule lets the probes and Prometheus in")
for i, rule in enumerate(ingress):
    rule_ports = [ports.get(p.get("port"), p.get("port")) for p in rule.get("ports", [])]
    if rule_ports != [http_port]:
        problem(f"NetworkPolicy: ingress rule {i} opens {rule_ports}, not only the HTTP port {http_port}")
    peers = rule.get("from", [])
    if not peers:
        problem(f"NetworkPolicy: ingress rule {i} admits every source, not the cluster only")
    for peer in peers:
        if "ipBlock" in peer:
            problem(f"NetworkPolicy: ingress rule {i} admits an ipBlock ({peer['ipBlock']}), not the cluster only")
egress_ports = {(p.get("port"), p.get("protocol", "TCP"))
                for rule in get(netpol, "spec", "egress", default=[])
                for p in rule.get("ports", [])}
for need in ((53, "UDP"), (53, "TCP"), (5432, "TCP"), (5671, "TCP"), (5672, "TCP"),
             (9092, "TCP"), (9093, "TCP")):
    if need not in egress_ports:
        problem(f"NetworkPolicy: egress does not allow port {need[0]}/{need[1]}")
for rule in get(netpol, "spec", "egress", default=[]):
    if not rule.get("ports"):
        problem("NetworkPolicy: an egress rule allows every port")

for img in kust.get("images", []):
    if img.get("newTag") != version:
        problem(f"kustomization.yaml: image {img.get('name')} newTag {img.get('newTag')} is not {version}")

# --- Compose ---------------------------------------------------------------
compose = yaml.safe_load(open("deploy/docker-compose.yml"))
services = compose.get("services", {})
relay_like = {n: s for n, s in services.items() if s.get("command") in (["run"], ["migrate"])}
images = {s.get("image") for s in relay_like.values()}
if len(images) != 1:
    problem(f"docker-compose.yml: the relay and migrate services use different images {images}")
for n, s in relay_like.items():
    b = s.get("build", {})
    if os.path.normpath(os.path.join("deploy", b.get("context", "."), b.get("dockerfile", ""))) \
            != "deploy/Dockerfile":
        problem(f"docker-compose.yml: {n} does not build deploy/Dockerfile")
    if s.get("command") == ["run"]:
        if s.get("read_only") is not True or s.get("cap_drop") != ["ALL"] \
                or "no-new-privileges:true" not in s.get("security_opt", []):
            problem(f"docker-compose.yml: {n} is not hardened like the pods (read_only, cap_drop ALL, no-new-privileges)")
envs = {n: s.get("environment") for n, s in relay_like.items()}
if len({repr(e) for e in envs.values()}) != 1:
    problem("docker-compose.yml: the migrate service does not take the relays' "
            "settings; migrate makes the table match them (OUTBOX_LISTEN, OUTBOX_RETENTION)")
for n in ("postgres", "rabbitmq"):
    if "healthcheck" not in services.get(n, {}):
        problem(f"docker-compose.yml: {n} has no healthcheck to wait on")

for p in problems:
    print(f"FAIL: {p}", file=sys.stderr)
sys.exit(min(len(problems), 100))
PY

# --- The runtime packages are the libraries the binary links ----------------
[ -s "$work/runtime-packages" ] || fail "Dockerfile: no apt-get install in the runtime stage"
needed_pkgs=()
while IFS= read -r soname; do
	case "$soname" in
	# The test build's sanitizer runtimes; the image builds without them.
	libasan.so.* | libubsan.so.*) continue ;;
	esac
	# The package owning the file the loader picks (not, say, the i386
	# copy of libm), compared by real path since /lib is /usr/lib.
	path=$(ldd "$RELAY_TEST_BIN" | awk -v so="$soname" '$1 == so { print $3 }')
	real=$(realpath -e "$path" 2>/dev/null || true)
	pkg=
	while read -r owner file; do
		if [ -n "$real" ] && [ "$(realpath -e "$file" 2>/dev/null)" = "$real" ]; then
			pkg=${owner%%:*}
			break
		fi
	done < <(dpkg -S "*/$soname" 2>/dev/null | sed 's/, [^:]*:/:/g' || true)
	if [ -z "$pkg" ]; then
		fail "no Debian package provides $soname, which the binary links"
		continue
	fi
	needed_pkgs+=("$pkg")
	# libc6 is in every Debian image.
	[ "$pkg" = libc6 ] || grep -qx "$pkg" "$work/runtime-packages" ||
		fail "Dockerfile: the runtime stage lacks $pkg (for $soname, which the binary links)"
done < <(readelf -d "$RELAY_TEST_BIN" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p')
[ ${#needed_pkgs[@]} -ge 5 ] || fail "readelf found only ${#needed_pkgs[@]} libraries in $RELAY_TEST_BIN"
while IFS= read -r pkg; do
	case " ${needed_pkgs[*]} tini ca-certificates curl " in
	*" $pkg "*) ;;
	*) fail "Dockerfile: the runtime stage installs $pkg, which the binary does not link" ;;
	esac
done <"$work/runtime-packages"

# --- systemd ---------------------------------------------------------------
unit=deploy/systemd/outbox-relay.service
for directive in NoNewPrivileges=yes ProtectSystem=strict KillSignal=SIGTERM; do
	grep -qx "$directive" "$unit" || fail "$unit: no $directive"
done
grep -Eqx 'DynamicUser=yes|User=[a-z_][a-z0-9_-]*' "$unit" || fail "$unit: neither DynamicUser=yes nor User="
grep -q '^EnvironmentFile=' "$unit" || fail "$unit: no EnvironmentFile="
grep -qx 'ExecStart=/usr/local/bin/outbox-relay run' "$unit" || fail "$unit: ExecStart is not '/usr/local/bin/outbox-relay run'"
# verify checks that ExecStart exists: point it at the built binary.
mkdir -p "$work/unit"
sed "s|^ExecStart=/usr/local/bin/outbox-relay |ExecStart=$RELAY_TEST_BIN |" "$unit" >"$work/unit/outbox-relay.service"
if ! command -v systemd-analyze >/dev/null 2>&1; then
	fail "systemd-analyze not found (Debian package systemd)"
elif ! systemd-analyze verify "$work/unit/outbox-relay.service" >"$work/verify.out" 2>&1 ||
	[ -s "$work/verify.out" ]; then
	fail "systemd-analyze verify $unit:"
	sed 's/^/    /' "$work/verify.out" >&2
fi

# --- Paths the deployment guide names ---------------------------------------
doc=docs/deployment.md
if [ -f "$doc" ]; then
	while IFS= read -r path; do
		[ -e "$path" ] || fail "$doc names $path, which does not exist"
	done < <(grep -o '\bdeploy/[A-Za-z0-9_./-]*[A-Za-z0-9_/]' "$doc" | sort -u)
else
	fail "missing $doc"
fi

if [ "$failures" -gt 0 ]; then
	echo "deploy_files: $failures problem(s)" >&2
	exit 1
fi
echo "deploy_files: Dockerfile, compose, Kubernetes and systemd files agree with the build"
