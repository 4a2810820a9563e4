#!/usr/bin/env bash
# scripts/check-deploy.sh: checks the operator-facing files against each other and the relay.
#
#   - deploy/prometheus: `promtool check rules`, `promtool test rules` (a firing and a
#     non-firing case per alert), `promtool check config` of the example configuration;
#   - every metric named in the rules and the dashboard is one src/serve/metrics/mod.rs serves;
#   - every alert has a summary, a description and a runbook_url whose anchor is a heading of
#     docs/src/operations/alerts.md;
#   - deploy/grafana/outbox-relay.json is valid JSON and every panel query parses as PromQL;
#   - deploy/kubernetes: the YAML parses; 2 replicas on one slot; liveness on /healthz and
#     readiness not on /readyz; terminationGracePeriodSeconds above relay.shutdown_timeout_ms;
#     every OUTBOX_RELAY__* variable is a real config key; and `outbox-relay config` accepts the
#     ConfigMap's file with the manifest's variables and the Secret's files;
#   - config/managed/*.toml (the managed-service examples): `outbox-relay config` accepts each,
#     with every key as the example sets it.
#
# Works on a fresh Debian/Ubuntu machine: installs promtool (package prometheus) and PyYAML
# (python3-yaml) when missing (needs root), builds the relay unless OUTBOX_RELAY_BIN names one.
# Ends with the line "N passed, N failed"; exits 1 when anything failed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
PROM=deploy/prometheus
RULES=$PROM/outbox-relay.rules.yml
RULE_TESTS=$PROM/outbox-relay.rules.test.yml
DASHBOARD=deploy/grafana/outbox-relay.json
K8S=deploy/kubernetes/outbox-relay.yaml
K8S_JOB=deploy/kubernetes/outbox-relay-slot-job.yaml
RUNBOOK=docs/src/operations/alerts.md

WORK=$(mktemp -d)
relay_pid=
# shellcheck disable=SC2317 # called through the EXIT trap
cleanup() {
    if [[ -n $relay_pid ]]; then
        kill -TERM "$relay_pid" 2>/dev/null
        wait "$relay_pid" 2>/dev/null
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

passed=0
failed=0
# check NAME COMMAND...: runs COMMAND, prints its output only when it fails.
check() {
    local name=$1
    shift
    if "$@" >"$WORK/out" 2>&1; then
        passed=$((passed + 1))
        echo "ok      $name"
    else
        failed=$((failed + 1))
        echo "FAILED  $name"
        sed 's/^/        /' "$WORK/out"
    fi
}

apt_install() {
    if [[ $(id -u) != 0 ]]; then
        echo "check-deploy: $* missing and not root: install it (apt-get install $*)" >&2
        return 1
    fi
    echo "check-deploy: installing $*" >&2
    apt-get update -qq >&2 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

# --- tools ------------------------------------------------------------------------------------
if ! command -v promtool >/dev/null 2>&1; then
    apt_install prometheus || { echo "0 passed, 1 failed"; exit 1; }
fi
PYTHON=
for candidate in python3 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
        "$candidate" -c 'import yaml' >/dev/null 2>&1; then
        PYTHON=$candidate
        break
    fi
done
if [[ -z $PYTHON ]]; then
    apt_install python3 python3-yaml || { echo "0 passed, 1 failed"; exit 1; }
    PYTHON=/usr/bin/python3
fi
RELAY=${OUTBOX_RELAY_BIN:-}
if [[ -z $RELAY ]]; then
    locked=()
    [[ -f Cargo.lock ]] && locked=(--locked)
    # Built as scripts/test.sh builds it (the tests' features): `cargo build`
    # would compile tokio and everything above it a second time.
    echo "check-deploy: building the relay (cargo test --no-run --workspace --test integration)" >&2
    if ! cargo test --no-run -q "${locked[@]}" --workspace --test integration >&2; then
        echo "FAILED  cargo test --no-run --test integration (builds the relay)"
        echo "0 passed, 1 failed"
        exit 1
    fi
    RELAY=$ROOT/target/debug/outbox-relay
fi

# --- Prometheus -------------------------------------------------------------------------------
check "promtool check rules $RULES" promtool check rules "$RULES"
check "promtool test rules $RULE_TESTS" promtool test rules "$RULE_TESTS"
check "promtool check config $PROM/prometheus.example.yml" \
    promtool check config "$PROM/prometheus.example.yml"

# Every alert has a firing and a non-firing case in the tests.
alerts_tested() {
    "$PYTHON" - "$RULES" "$RULE_TESTS" <<'EOF'
import sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
tests = yaml.safe_load(open(sys.argv[2]))
alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
firing, quiet = set(), set()
for t in tests["tests"]:
    for case in t.get("alert_rule_test", []):
        (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
bad = [a for a in alerts if a not in firing or a not in quiet]
for a in bad:
    print(f"{a}: firing case {'yes' if a in firing else 'MISSING'}, "
          f"non-firing case {'yes' if a in quiet else 'MISSING'}")
print(f"{len(alerts)} alerts, {len(alerts) - len(bad)} with both cases")
sys.exit(1 if bad or not alerts else 0)
EOF
}
check "every alert has a firing and a non-firing test" alerts_tested

# Metric names used by the rules and the dashboard are served by src/serve/metrics/mod.rs.
metric_names_real() {
    "$PYTHON" - src/serve/metrics/mod.rs "$RULES" "$DASHBOARD" <<'EOF'
import re, sys
src = open(sys.argv[1]).read()
served = set(re.findall(r'"(outbox_relay_[a-z_]+)', src))
served |= {n for n in re.findall(r'(outbox_relay_[a-z_]+)\{', src)}
# Histograms (declared with `r.histogram(NAME, HELP)`) also serve _bucket, _sum and _count.
for h in re.findall(r'\.histogram\(\s*"(outbox_relay_[a-z_]+)"', src):
    served |= {h + "_bucket", h + "_sum", h + "_count"}
bad = []
for path in sys.argv[2:]:
    used = set(re.findall(r'\b(outbox_relay_[a-z_]+)', open(path).read()))
    bad += [f"{path}: {m} is not served by src/serve/metrics/mod.rs" for m in sorted(used - served)]
print("\n".join(bad) or f"served: {', '.join(sorted(served))}")
sys.exit(1 if bad else 0)
EOF
}
check "rules and dashboard name only metrics the relay serves" metric_names_real

# Annotations and runbook anchors.
runbook_links() {
    "$PYTHON" - "$RULES" "$RUNBOOK" <<'EOF'
import re, sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
doc = open(sys.argv[2]).read()
def slug(heading):
    # GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'.
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")
in_code = False
anchors = set()
for line in doc.splitlines():
    if line.startswith("```"):
        in_code = not in_code
    elif not in_code and re.match(r"#{1,6} ", line):
        anchors.add(slug(line.lstrip("#")))
bad = []
for g in rules["groups"]:
    for r in g["rules"]:
        if "alert" not in r:
            continue
        a = r.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not a.get(key):
                bad.append(f"{r['alert']}: no {key}")
        url = a.get("runbook_url", "")
        path, _, anchor = url.partition("#")
        if path != sys.argv[2] or anchor not in anchors:
            bad.append(f"{r['alert']}: runbook_url {url} is not a heading of {sys.argv[2]}")
        if slug(r["alert"]) not in anchors:
            bad.append(f"{r['alert']}: {sys.argv[2]} has no section named after it")
print("\n".join(bad) or f"{len(anchors)} headings; every alert links to its section")
sys.exit(1 if bad else 0)
EOF
}
check "every alert has summary, description and a runbook_url into $RUNBOOK" runbook_links

# The rules against the relay's real exposition: run it with PostgreSQL unreachable (it then
# serves /metrics in state "reconnecting"), check that every label the rules and the dashboard
# match on exists on that metric with that value, and replay the scrape through promtool:
# OutboxRelayNotReady and OutboxRelayNoActiveRelay must fire, the others must not.
real_metrics() {
    env -i PATH="$PATH" OUTBOX_RELAY__POSTGRES__URL=postgres://relay@127.0.0.1:1/none \
        OUTBOX_RELAY__HTTP__LISTEN=127.0.0.1:0 "$RELAY" run >"$WORK/relay.log" 2>&1 &
    relay_pid=$!
    "$PYTHON" - "$WORK/relay.log" "$WORK/metrics.txt" <<'EOF'
import re, sys, time, urllib.request
deadline = time.monotonic() + 30
addr = None
while time.monotonic() < deadline:
    m = re.search(r"serving /metrics.* addr=(\S+)", open(sys.argv[1]).read())
    if m:
        addr = m.group(1)
        text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
        if 'outbox_relay_state{state="reconnecting"} 1' in text:
            open(sys.argv[2], "w").write(text)
            sys.exit(0)
    time.sleep(0.2)
print(f"no /metrics in state reconnecting within 30 s (listener: {addr}); relay log:")
print(open(sys.argv[1]).read())
sys.exit(1)
EOF
    local rc=$?
    kill -TERM "$relay_pid" 2>/dev/null
    wait "$relay_pid" 2>/dev/null
    relay_pid=
    ((rc == 0)) || return 1
    "$PYTHON" - "$WORK/metrics.txt" "$ROOT/$RULES" "$DASHBOARD" "$WORK/real.test.yml" <<'EOF' || return 1
import re, sys, yaml
metrics_path, rules_path, dash_path, test_path = sys.argv[1:]
# The exposition: metric name -> label -> values seen, and every sample.
labels, series = {}, []
for line in open(metrics_path):
    m = re.match(r"# TYPE (\S+) (\S+)", line)
    if m:
        labels.setdefault(m.group(1), {})
    if line.startswith("#") or not line.strip():
        continue
    m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)\n?", line)
    name, body, value = m.group(1), m.group(2) or "", m.group(3)
    pairs = dict(re.findall(r'(\w+)="([^"]*)"', body))
    base = name if name in labels else re.sub(r"_(bucket|sum|count)$", "", name)
    for k, v in pairs.items():
        labels[base].setdefault(k, set()).add(v)
    series.append((name, pairs, float(value)))
# Label names a metric only has later (no sample to see them in yet): once an error happened,
# once a session's producer reported librdkafka's statistics, or once Kafka refused a topic.
LATER = {"outbox_relay_delivery_errors_total": {"kind"},
         "outbox_relay_kafka_blocked": {"reason", "topic"},
         "outbox_relay_kafka_rtt_seconds": {"broker", "quantile"},
         "outbox_relay_kafka_queue_seconds": {"broker", "quantile"}}
problems = []
for path in (rules_path, dash_path):
    text = open(path).read().replace('\\"', '"')
    for metric, body in re.findall(r"(outbox_relay_\w+)\{([^}]*)\}", text):
        base = re.sub(r"_(bucket|sum|count)$", "", metric)
        known = labels.get(base)
        if known is None:
            problems.append(f"{path}: {metric} is not in the relay's /metrics")
            continue
        for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', body):
            if label in ("job", "instance", "le") or label in LATER.get(base, ()):
                continue
            if label not in known:
                problems.append(f"{path}: {metric} has no label {label} (has: {sorted(known)})")
                continue
            if op in ("=", "=~") and "$" not in value:
                for wanted in value.split("|") if op == "=~" else [value]:
                    if wanted not in known[label]:
                        problems.append(f'{path}: {metric}{{{label}="{wanted}"}}: '
                                        f"the relay serves {label} in {sorted(known[label])}")
if problems:
    print("\n".join(problems))
    sys.exit(1)
# The scrape as promtool input: this relay, reconnecting for 20 minutes, scraped as the only
# target of job outbox-relay.
target = 'job="outbox-relay", instance="relay-0:9187"'
def selector(name, pairs):
    inner = ", ".join([target] + [f'{k}="{v}"' for k, v in sorted(pairs.items())])
    return f"{name}{{{inner}}}"
inputs = [{"series": "up{" + target + "}", "values": "1x20"}]
for name, pairs, value in series:
    inputs.append({"series": selector(name, pairs), "values": f"{value:g}x20"})
rules = yaml.safe_load(open(rules_path))
alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
def expected(name, lab):
    annotations = {}
    for key, text in alerts[name]["annotations"].items():
        for k, v in lab.items():
            text = text.replace("{{ $labels." + k + " }}", v)
        annotations[key] = text
    return {"exp_labels": dict(lab, severity=alerts[name]["labels"]["severity"]),
            "exp_annotations": annotations}
firing = {
    "OutboxRelayNotReady": expected("OutboxRelayNotReady",
                                    {"job": "outbox-relay", "instance": "relay-0:9187"}),
    "OutboxRelayNoActiveRelay": expected("OutboxRelayNoActiveRelay", {"job": "outbox-relay"}),
}
cases = [{"eval_time": "15m", "alertname": name,
          "exp_alerts": [firing[name]] if name in firing else []} for name in alerts]
yaml.safe_dump({"rule_files": [rules_path], "evaluation_interval": "1m",
                "tests": [{"name": "the relay's real /metrics while PostgreSQL is unreachable",
                           "interval": "1m", "input_series": inputs,
                           "alert_rule_test": cases}]},
               open(test_path, "w"), sort_keys=False, width=1000)
print(f"{len(series)} samples; every label matched exists")
EOF
    promtool test rules "$WORK/real.test.yml"
}
check "the relay's real /metrics: labels match; NotReady and NoActiveRelay fire" real_metrics

# --- Grafana ----------------------------------------------------------------------------------
dashboard_queries() {
    "$PYTHON" - "$DASHBOARD" "$WORK/dashboard-rules.yml" <<'EOF'
import json, sys, yaml
dash = json.load(open(sys.argv[1]))
exprs = []
def walk(panels):
    for p in panels:
        walk(p.get("panels", []))
        for t in p.get("targets", []):
            exprs.append((p["title"], t["expr"]))
walk(dash["panels"])
for a in dash.get("annotations", {}).get("list", []):
    if a.get("expr"):
        exprs.append(("annotation " + a["name"], a["expr"]))
# Grafana's variables, replaced by values PromQL accepts, so promtool can parse each query.
subst = {"$__rate_interval": "5m", "$__interval": "1m", "$job": ".*", "$instance": ".*"}
rules = []
for i, (title, e) in enumerate(exprs):
    for k, v in subst.items():
        e = e.replace(k, v)
    rules.append({"record": f"dashboard:query_{i}", "expr": e})
need = ["outbox_relay_events_published_total", "outbox_relay_records_in_flight",
        "outbox_relay_slot_lag_bytes", "outbox_relay_slot_retained_wal_bytes",
        "outbox_relay_commit_to_ack_seconds_bucket", "outbox_relay_events_dead_lettered_total",
        "outbox_relay_reconnects_total", "outbox_relay_state"]
text = " ".join(e for _, e in exprs)
missing = [m for m in need if m not in text]
if missing:
    print("dashboard shows none of: " + ", ".join(missing))
    sys.exit(1)
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))
print(f"{len(exprs)} queries")
EOF
}
check "$DASHBOARD: valid JSON, covers the relay's metrics" dashboard_queries
check "$DASHBOARD: every query parses as PromQL" promtool check rules "$WORK/dashboard-rules.yml"

# --- Kubernetes -------------------------------------------------------------------------------
# Writes $WORK/k8s/: outbox-relay.toml (the ConfigMap's file), secrets/ (the Secret's files),
# env (the container's OUTBOX_RELAY__* variables, paths moved into $WORK/k8s/secrets), and
# checks the invariants that need no relay.
k8s_manifest() {
    "$PYTHON" - "$K8S" "$K8S_JOB" "$WORK/k8s" <<'EOF'
import os, sys, yaml
manifest, job_file, out = sys.argv[1], sys.argv[2], sys.argv[3]
docs = [d for d in yaml.safe_load_all(open(manifest)) if d]
kinds = {d["kind"]: d for d in docs}
problems = []
def need(cond, what):
    if not cond:
        problems.append(what)
for kind in ("Secret", "ConfigMap", "Deployment"):
    need(kind in kinds, f"no {kind}")
if problems:
    print("\n".join(problems)); sys.exit(1)
secret, cm, dep = kinds["Secret"], kinds["ConfigMap"], kinds["Deployment"]
spec = dep["spec"]
pod = spec["template"]["spec"]
need(spec.get("replicas") == 2, f"replicas is {spec.get('replicas')}, expected 2 (one streams, one stands by)")
sel = spec["selector"]["matchLabels"]
labels = spec["template"]["metadata"]["labels"]
need(all(labels.get(k) == v for k, v in sel.items()), "the selector does not match the pod labels")
containers = pod["containers"]
need(len(containers) == 1, "expected one container")
c = containers[0]
ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
def probe_path(name):
    probe = c.get(name) or {}
    http = probe.get("httpGet") or {}
    port = http.get("port")
    need(port in ports or port in ports.values(), f"{name} port {port} is not a container port")
    return http.get("path")
need(probe_path("livenessProbe") == "/healthz", "livenessProbe must GET /healthz")
ready = probe_path("readinessProbe")
need(ready is not None, "no readinessProbe")
need(ready != "/readyz", "readinessProbe on /readyz: a standby is never ready, rollouts would stall")
need("Service" not in kinds, "a Service would route to a relay: nothing connects to it")
# The ConfigMap's config file, mounted where --config points.
args = c.get("args", []) + c.get("command", [])
config_path = args[args.index("--config") + 1] if "--config" in args else None
need(config_path is not None, "the container does not pass --config")
mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
volumes = {v["name"]: v for v in pod.get("volumes", [])}
config_file = None
for name, path in mounts.items():
    v = volumes.get(name, {})
    if "configMap" in v and config_path and config_path.startswith(path.rstrip("/") + "/"):
        need(v["configMap"]["name"] == cm["metadata"]["name"], "the config volume names another ConfigMap")
        config_file = config_path[len(path.rstrip("/")) + 1:]
need(config_file in cm.get("data", {}), f"--config {config_path} is not a file of the ConfigMap")
if problems:
    print("\n".join(problems)); sys.exit(1)
os.makedirs(out + "/secrets", exist_ok=True)
open(out + "/outbox-relay.toml", "w").write(cm["data"][config_file])
# The Secret's files, where the relay will find them once the mount path is rewritten.
secret_data = dict(secret.get("stringData", {}))
secret_mount = None
for name, path in mounts.items():
    v = volumes.get(name, {})
    if "secret" in v:
        need(v["secret"]["secretName"] == secret["metadata"]["name"], "the secret volume names another Secret")
        secret_mount = path.rstrip("/")
        for item in v["secret"].get("items") or [{"key": k, "path": k} for k in secret_data]:
            need(item["key"] in secret_data, f"secret volume item {item['key']} is not in the Secret")
            open(f"{out}/secrets/{item['path']}", "w").write(secret_data.get(item["key"], ""))
# Environment: OUTBOX_RELAY__* only (plus the relay's own OUTBOX_RELAY_LOG / _CONFIG).
def env_lines(container, where):
    lines = []
    for e in container.get("env", []):
        name = e["name"]
        if not name.startswith("OUTBOX_RELAY__"):
            need(name in ("OUTBOX_RELAY_LOG", "OUTBOX_RELAY_CONFIG"), f"{where}: {name} is not read by the relay")
            continue
        if "value" in e:
            value = str(e["value"])
            if secret_mount and value.startswith(secret_mount + "/"):
                value = out + "/secrets/" + value[len(secret_mount) + 1:]
        else:
            ref = e.get("valueFrom", {}).get("secretKeyRef", {})
            need(ref.get("name") == secret["metadata"]["name"] and ref.get("key") in secret_data,
                 f"{where}: {name} takes a key the Secret does not have")
            value = secret_data.get(ref.get("key"), "")
        lines.append(f"{name}={value}")
    return lines
lines = env_lines(c, "Deployment")
open(out + "/env", "w").write("".join(l + "\0" for l in lines))
# The slot Job runs with the same config and variables.
job = next(d for d in yaml.safe_load_all(open(job_file)) if d)
jc = job["spec"]["template"]["spec"]["containers"][0]
job_lines = env_lines(jc, "Job")
need(sorted(job_lines) == sorted(lines), "the Job's variables differ from the Deployment's")
need(job["spec"]["template"]["spec"]["volumes"] == pod["volumes"], "the Job's volumes differ from the Deployment's")
grace = pod.get("terminationGracePeriodSeconds")
need(isinstance(grace, int), "no terminationGracePeriodSeconds")
open(out + "/grace", "w").write(str(grace))
print("\n".join(problems) or f"config {config_file}, {len(lines)} OUTBOX_RELAY__ variables, grace {grace}s")
sys.exit(1 if problems else 0)
EOF
}
check "$K8S: parses; 2 replicas, probes, ConfigMap, Secret, Job consistent" k8s_manifest

job_script_parses() {
    "$PYTHON" -c 'import sys, yaml
job = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d)
c = job["spec"]["template"]["spec"]["containers"][0]
assert c["command"] == ["/bin/sh", "-c"], c["command"]
print(c["args"][0])' "$K8S_JOB" >"$WORK/job.sh" && sh -n "$WORK/job.sh"
}
check "$K8S_JOB: its shell script parses" job_script_parses

# The relay itself accepts the ConfigMap's file with the manifest's variables (it refuses
# unknown keys and OUTBOX_RELAY__ variables naming no key) and reads the Secret's files.
relay_accepts_config() {
    [[ -f $WORK/k8s/env ]] || { echo "manifest check failed: nothing to feed the relay"; return 1; }
    local vars=()
    mapfile -d '' vars <"$WORK/k8s/env"
    env -i PATH="$PATH" "${vars[@]}" "$RELAY" config --config "$WORK/k8s/outbox-relay.toml" \
        >"$WORK/k8s/effective.toml" || return 1
    "$PYTHON" - "$WORK/k8s/effective.toml" "$WORK/k8s/env" "$WORK/k8s/grace" <<'EOF'
import json, re, sys
try:
    import tomllib
    effective = tomllib.load(open(sys.argv[1], "rb"))
except ImportError:
    # Python before 3.11: the relay's own output is simple enough to read line by line
    # ([section.sub] headers, key = value with TOML strings, integers, booleans, arrays).
    effective, table = {}, None
    for line in open(sys.argv[1]):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[([\w.]+)\]", line)
        if m:
            table = effective
            for part in m.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        key, _, value = line.partition(" = ")
        value = {"true": True, "false": False}.get(value, value)
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value):
            value = int(value)
        elif isinstance(value, str) and value.startswith('"'):
            value = json.loads(value)
        table[key.strip('"')] = value
problems = []
for line in filter(None, open(sys.argv[2]).read().split("\0")):
    name, _, value = line.partition("=")
    path = name[len("OUTBOX_RELAY__"):].lower().split("__")
    node = effective
    for p in path:
        node = node.get(p) if isinstance(node, dict) else None
    if node is None:
        problems.append(f"{name}: no key {'.'.join(path)} in the effective config")
    elif str(node).lower() != value.lower() and node != "***":
        problems.append(f"{name}: effective {'.'.join(path)} is {node!r}, not {value!r}")
shutdown_ms = effective["relay"]["shutdown_timeout_ms"]
grace = int(open(sys.argv[3]).read())
if grace * 1000 <= shutdown_ms + 5000:
    problems.append(f"terminationGracePeriodSeconds {grace}s is not above relay.shutdown_timeout_ms "
                    f"{shutdown_ms} ms plus 5 s for the final confirmation and exit")
checks = {("postgres", "create_slot"): False, ("http", "listen"): "0.0.0.0:9187"}
for (section, key), want in checks.items():
    if effective[section][key] != want:
        problems.append(f"{section}.{key} is {effective[section][key]!r}, expected {want!r}")
print("\n".join(problems) or f"accepted; shutdown_timeout_ms {shutdown_ms} < grace {grace}s")
sys.exit(1 if problems else 0)
EOF
}
check "outbox-relay config accepts the ConfigMap with the manifest's env and Secret" relay_accepts_config

# The managed-service examples (docs/src/guides/managed/index.md): the relay accepts
# each, with the files it names (secrets, CA bundles) made under $WORK, and every key comes
# out in the effective config as the example sets it.
managed_example() {
    local file=$1 dir path
    dir="$WORK/managed/$(basename "$file" .toml)"
    mkdir -p "$dir/files"
    sed -e "s|/run/secrets/|$dir/files/|g" -e "s|/etc/outbox-relay/|$dir/files/|g" \
        "$file" >"$dir/config.toml"
    grep -o "$dir/files/[A-Za-z0-9._-]*" "$dir/config.toml" | sort -u | while read -r path; do
        echo "example-secret" >"$path"
    done
    env -i PATH="$PATH" "$RELAY" config --config "$dir/config.toml" >"$dir/effective.toml" || return 1
    "$PYTHON" - "$dir/effective.toml" "$dir/config.toml" <<'EOF'
import sys, tomllib
effective = tomllib.load(open(sys.argv[1], "rb"))
example = tomllib.load(open(sys.argv[2], "rb"))
problems = []
def walk(want, got, path):
    for key, value in want.items():
        here = got.get(key) if isinstance(got, dict) else None
        if isinstance(value, dict):
            walk(value, here, path + [key])
        elif here != value and here != "***":
            problems.append(f"{'.'.join(path + [key])}: example {value!r}, effective {here!r}")
walk(example, effective, [])
print("\n".join(problems) or "accepted, every key as the example sets it")
sys.exit(1 if problems else 0)
EOF
}
for example in config/managed/*.toml; do
    check "outbox-relay config accepts $example" managed_example "$example"
done

echo "$passed passed, $failed failed"
((failed == 0))
