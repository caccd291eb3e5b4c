# Shared by scripts/controlplane-assets and scripts/stack-assets (sourced, not run).
#
# Callers set: log_prefix, build_timeout, go_flags (array) and a `modules_root`
# under which each target's module directory lives.  build_one builds one
# binary atomically with a heartbeat; cleanup (installed as the EXIT trap)
# stops an interrupted build and removes its partial file.

log() { printf '[%s] %s\n' "$log_prefix" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The version a go.mod requires for one module path (first match).
pinned() {
    local gomod=$1 module=$2 version
    version=$(awk -v m="$module" '$1 == m && $2 ~ /^v/ {print $2; exit}
                                  $1 == "require" && $2 == m {print $3; exit}' "$gomod")
    [[ -n $version ]] || die "$gomod does not require $module"
    printf '%s' "$version"
}

have_all() {
    local dir=$1; shift
    local b
    for b in "$@"; do [[ -x $dir/$b ]] || return 1; done
}

# Build one binary into $dir atomically: go writes a temporary name in the same
# directory, the rename makes it visible only once complete.
# spec: "name|module dir (relative to modules_root)|package|ldflags"
build_one() {
    command -v go >/dev/null || die "go not found on PATH (Go >= 1.26 is needed to build the local cluster)"
    local dir=$1 spec=$2 name moddir pkg ldflags tmp start pid next_beat rc
    IFS='|' read -r name moddir pkg ldflags <<<"$spec"
    tmp="$dir/.$name.tmp.$$"
    start=$SECONDS
    log "building $name ($pkg) ..."
    # Own session and process group (setsid), so cleanup stops go *and* the
    # compiler/linker processes it started; nice, so a build never starves the
    # tests or other work sharing a small machine.
    # go's own lines (hundreds of "go: downloading" on a first build) go to a log,
    # shown only when the build fails: make test's output stays readable.
    (cd "$modules_root/$moddir" && exec setsid nice -n 10 go build "${go_flags[@]}" -ldflags "$ldflags" -o "$tmp" "$pkg" >"$tmp.log" 2>&1) &
    pid=$!
    build_pid=$pid build_tmp=$tmp
    # A heartbeat each minute so a long first build is visibly alive; bounded by
    # the build timeout.
    rc=0
    next_beat=$((start + 60))
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS - start > build_timeout)); then
            die "building $name took longer than ${build_timeout}s (CONTROLPLANE_BUILD_TIMEOUT)"
        fi
        if ((SECONDS >= next_beat)); then
            log "  ... still building $name, $(((SECONDS - start) / 60)) min elapsed"
            next_beat=$((next_beat + 60))
        fi
        sleep 1
    done
    wait "$pid" || rc=$?
    if ((rc != 0)); then
        tail -n 60 "$tmp.log" >&2 || true
        rm -f "$tmp.log"
        die "go build of $name failed (exit $rc)"
    fi
    rm -f "$tmp.log"
    mv -f "$tmp" "$dir/$name"
    build_pid="" build_tmp=""
    log "built $name in $((SECONDS - start))s"
}

# An interrupted or failed run stops its go build and leaves no partial file.
build_pid="" build_tmp=""
cleanup() {
    if [[ -n $build_pid ]]; then
        kill -TERM -- "-$build_pid" 2>/dev/null || true
        wait "$build_pid" 2>/dev/null || true
        kill -KILL -- "-$build_pid" 2>/dev/null || true
    fi
    if [[ -n $build_tmp ]]; then rm -f "$build_tmp" "$build_tmp.log"; fi
}
