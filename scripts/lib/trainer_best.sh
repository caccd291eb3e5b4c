# The "best push" Trainer of benchmarks.vs_push (sourced by scripts/stack-assets; run
# as `scripts/stack-assets trainer-best`, never by `make demo` or the stack's bundle).
#
# Trainer v2.3.0's trainer-controller-manager with our patch
# patches/trainer-statusserver-deadline.diff (ours, not upstream's): a copy of the
# module source from the Go module cache, patched, built against the same go.mod/go.sum
# as tools/stack/trainer (a replace directive to the copy) into a cache directory of
# its own, named by the version and a stamp of go.mod, go.sum, the patch and the flags.
# Sets component_dir to that directory (it holds trainer-controller-manager).
# Callers set: cache_root, modules_root, go_flags, trainer_version; module_dir and
# copy_tree come from scripts/stack-assets.

trainer_best_component() {
    local patch_file=$repo_root/patches/trainer-statusserver-deadline.diff stamp dir src
    local base=$modules_root/stack/trainer
    stamp=$({
        printf 'flags=%s\n' "${go_flags[*]}"
        cat "$base/go.mod" "$base/go.sum" "$patch_file"
    } | sha256sum | cut -c1-12)
    dir="$cache_root/trainer-best-${trainer_version}_$stamp"
    component_dir=$dir
    if [[ -x $dir/trainer-controller-manager ]]; then return; fi
    mkdir -p "$dir"
    src=$(module_dir stack/trainer github.com/kubeflow/trainer/v2 "$trainer_version")
    rm -rf "$dir/src" "$dir/mod"
    copy_tree "$src" "$dir/src"
    patch -d "$dir/src" -p1 --forward --batch --quiet <"$patch_file" \
        || die "patches/trainer-statusserver-deadline.diff does not apply to $trainer_version"
    mkdir -p "$dir/mod"
    cp "$base/go.mod" "$base/go.sum" "$dir/mod/"
    (cd "$dir/mod" && go mod edit -replace "github.com/kubeflow/trainer/v2=$dir/src")
    # build_one reads the module directory under modules_root (dynamic scope).
    local modules_root=$dir
    build_one "$dir" "trainer-controller-manager|mod|github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager|"
}
