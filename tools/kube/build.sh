#!/usr/bin/env bash
# Build the real control plane the cluster tests run — etcd, kube-apiserver,
# kube-controller-manager, the JobSet controller and Kueue's manager — from their published Go
# modules (GOPROXY), pinned in versions.env, into a cache outside the repository:
#
#   ${SHARDMETER_KUBE_CACHE:-$HOME/.cache/shardmeter/kube}/<name>-v<version>/
#       bin/…           the binaries
#       config/…        (jobset, kueue) the module's kustomize tree: CRDs, webhooks, RBAC
#       .built          written last: a directory without it is rebuilt
#
#   trainer-v<version>/config/{crds,runtimes}   Kubeflow Trainer's CRDs and runtimes, no binary
#
# Usage: tools/kube/build.sh [kubernetes|etcd|jobset|kueue|trainer]...   (none: all)
# A component already built is skipped, so `make test` calls this on every run for ~nothing.
# Builds run under `nice`: the machines are shared.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${SHARDMETER_KUBE_CACHE:-$HOME/.cache/shardmeter/kube}
mkdir -p "$cache"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath
NICE=(nice -n 19)

log() { printf '[kube-build] %s\n' "$*" >&2; }

# The module's directory in GOMODCACHE (downloaded if needed).
module_dir() { (cd "$1" && go mod download -json "$2" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'); }

build_kubernetes() {  # $1: build dir, $2: destination
  local work=$1 dest=$2 v=$KUBE_VERSION minor=${KUBE_VERSION#*.}
  minor=${minor%%.*}
  cd "$work"
  go mod init shardmeter.local/build/kubernetes >/dev/null 2>&1
  go mod edit -go=1.26.0 -require="k8s.io/kubernetes@v$v"
  # k8s.io/kubernetes requires its staging modules as v0.0.0 and replaces them with
  # ./staging/src paths, which a depending module ignores: replace each with its published
  # v0.<minor>.<patch> instead.
  local gomod staging
  gomod=$(go mod download -json "k8s.io/kubernetes@v$v" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
  staging=$(sed -n 's/^\t\(k8s\.io\/[a-z0-9-]*\) v0\.0\.0$/\1/p' "$gomod")
  [ -n "$staging" ] || { log "no staging modules found in $gomod"; return 1; }
  local m
  for m in $staging; do go mod edit -replace="$m=$m@v0.${v#*.}"; done
  local now pkg ldflags=""
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  # What `kubectl version` and /version answer (hack/lib/version.sh sets the same variables).
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=v$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$now"
  done
  "${NICE[@]}" go build -mod=mod -ldflags "-s -w$ldflags" -o "$dest/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
}

build_etcd() {
  local work=$1 dest=$2 v=$ETCD_VERSION
  cd "$work"
  go mod init shardmeter.local/build/etcd >/dev/null 2>&1
  # etcd's own main package (go.etcd.io/etcd/v3) is this one line; server/v3 replaces its
  # sibling modules with ../ paths, so they are required here at the same published version.
  cat >main.go <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  local m
  go mod edit -go=1.26.0 -require="go.etcd.io/etcd/server/v3@v$v"
  for m in api/v3 client/pkg/v3 client/v3 pkg/v3; do
    go mod edit -require="go.etcd.io/etcd/$m@v$v"
  done
  "${NICE[@]}" go build -mod=mod -ldflags "-s -w" -o "$dest/bin/etcd" .
}

# A controller-runtime manager whose go.mod has no replace directives, built from a module
# that requires it alone — the versions `go install mod@version` would pick. (go install itself
# reads the module's version list to check for deprecation, which the proxy may refuse.)
build_manager() {  # $1 work, $2 dest, $3 module, $4 main package, $5 version, $6 binary name
  local work=$1 dest=$2 module=$3 main=$4 v=$5 binary=$6 dir
  cd "$work"
  go mod init "shardmeter.local/build/$binary" >/dev/null 2>&1
  go mod edit -go=1.26.0 -require="$module@v$v"
  "${NICE[@]}" go build -mod=mod -ldflags "-s -w -X $module/pkg/version.GitVersion=v$v" \
    -o "$dest/bin/$binary" "$main"
  dir=$(module_dir "$work" "$module@v$v")
  # The module's kustomize tree (CRDs, webhook manifests, RBAC, the manager's configuration):
  # the tests render config/default with `kubectl kustomize`, as a release's manifests are.
  cp -r "$dir/config" "$dest/config"
  chmod -R u+w "$dest/config"
}

build_jobset() {
  build_manager "$1" "$2" sigs.k8s.io/jobset sigs.k8s.io/jobset "$JOBSET_VERSION" jobset
}
build_kueue() {
  build_manager "$1" "$2" sigs.k8s.io/kueue sigs.k8s.io/kueue/cmd/kueue "$KUEUE_VERSION" kueue
}

# Kubeflow Trainer v2: its CRDs (TrainJob, the runtimes) and the ClusterTrainingRuntimes it
# installs — no controller runs in the tests.
# The version Kueue's go.mod requires, so Kueue's TrainJob integration and webhook match it.
build_trainer() {
  local work=$1 dest=$2 dir
  dir=$(module_dir "$work" "github.com/kubeflow/trainer/v2@v$TRAINER_VERSION")
  mkdir -p "$dest/config"
  cp -r "$dir/manifests/base/crds" "$dest/config/crds"
  cp -r "$dir/manifests/base/runtimes" "$dest/config/runtimes"  # ClusterTrainingRuntimes
  chmod -R u+w "$dest/config"
}

build() {
  local name=$1 version dest work start
  case $name in
    kubernetes) version=$KUBE_VERSION ;;
    etcd) version=$ETCD_VERSION ;;
    jobset) version=$JOBSET_VERSION ;;
    kueue) version=$KUEUE_VERSION ;;
    trainer) version=$TRAINER_VERSION ;;
    *) log "unknown component '$name' (kubernetes, etcd, jobset, kueue or trainer)"; return 2 ;;
  esac
  dest="$cache/$name-v$version"
  grep -qs "^recipe $RECIPE\$" "$dest/.built" && return 0
  log "building $name v$version into $dest (once per machine; minutes)"
  start=$(date +%s)
  rm -rf "$dest" && mkdir -p "$dest/bin"
  work=$(mktemp -d "$cache/.work-$name.XXXXXX")
  # A plain statement, so that errexit holds inside the subshell (in `if` or `||` it would not).
  set +e
  (set -e; build_"$name" "$work" "$dest")
  local rc=$?
  set -e
  if [ "$rc" -ne 0 ]; then
    rm -rf "$work" "$dest"
    log "building $name v$version failed"
    return 1
  fi
  cp "$work/go.mod" "$dest/build-go.mod" 2>/dev/null || true
  rm -rf "$work"
  printf '%s\nrecipe %s\n' \
    "$name v$version built in $(($(date +%s) - start)) s on $(date -u +%FT%TZ)" "$RECIPE" \
    >"$dest/.built"
  log "$(head -1 "$dest/.built")"
}

[ $# -gt 0 ] || set -- etcd kubernetes jobset kueue trainer
for component in "$@"; do build "$component"; done
