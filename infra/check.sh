#!/usr/bin/env bash
# Offline checks of everything Breakwater deploys, without Docker or an AWS account:
#   1. docker-compose.yml, compose.fargate.yml and their merge against the Compose
#      specification's schema, and the merged API limits (0.25 CPU, 512M, no swap);
#   2. cfn-lint on every CloudFormation template;
#   3. checkov on the templates and the Dockerfile (every skip must carry its reason and
#      suppress a check that ran);
#   4. the invariants linters do not know (infra/checks/invariants.py).
# Installs its tools, pinned in infra/requirements.txt, in a virtualenv under target/ (or
# $INFRA_VENV) once per requirements change. Runs every step and exits non-zero if any failed.
# CI: `bash infra/check.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
out=target/infra-check
# INFRA_VENV: keep the tools somewhere that outlives a fresh clone (a CI cache) to skip the install.
venv=${INFRA_VENV:-target/infra-venv}
mkdir -p "$out"

log() { printf '\n==> %s\n' "$*"; }
failed=()
step() {
  local name=$1 t0=$SECONDS
  shift
  if "$@"; then
    echo "--> $name: ok ($((SECONDS - t0)) s)"
  else
    echo "--> $name: FAILED ($((SECONDS - t0)) s)" >&2
    failed+=("$name")
  fi
}
quietly() { "$@" > /dev/null; }

log "Tools (virtualenv $venv)"
stamp="$venv/.requirements.sha256"
want=$(sha256sum infra/requirements.txt | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python3 -m venv "$venv" || { echo "python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r infra/requirements.txt || exit 1
  echo "$want" > "$stamp"
fi
py="$venv/bin/python"
"$py" -c 'from importlib.metadata import version as v; print(*(f"{p} {v(p)}" for p in ("cfn-lint", "checkov", "check-jsonschema", "PyYAML")), sep=", ")'

log "Compose: merge and limits"
step compose "$py" infra/checks/compose.py "$out/compose.merged.json"

log "Compose: the Compose specification's schema"
step compose-schema "$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec \
  docker-compose.yml compose.fargate.yml "$out/compose.merged.json"

log "CloudFormation: cfn-lint"
step cfn-lint "$venv/bin/cfn-lint" infra/cloudformation/*.yaml

log "checkov: templates and Dockerfile"
files=()
for f in infra/cloudformation/*.yaml Dockerfile; do files+=(-f "$f"); done
# --skip-download: offline, no platform calls. The JSON report (read by the next step, which
# prints each failure and checks every skip) is the only output.
rm -rf "$out/checkov"
step checkov quietly "$venv/bin/checkov" "${files[@]}" --framework cloudformation dockerfile --skip-download \
  -o json --output-file-path "$out/checkov"

log "CloudFormation: invariants"
step invariants "$py" infra/checks/invariants.py --checkov-json "$out/checkov/results_json.json"

elapsed=$((SECONDS - started))
if [ ${#failed[@]} -gt 0 ]; then
  echo "infra/check.sh: FAILED: ${failed[*]} (${elapsed} s)" >&2
  exit 1
fi
echo "infra/check.sh: all checks passed (${elapsed} s)"
