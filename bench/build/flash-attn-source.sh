# flash-attn-source.sh: sourced by the benchmarks that build flash-attention's real-nvcc
# subset (caps.sh, farm-flash-attn.sh), so they unpack it one way. The caller has sourced
# cgroups.sh (for die) and set script_dir, work_dir and torch_env (a venv with torch).

# Unpacks flash-attention 2.8.3's PyPI sdist (downloaded once into ~/.cache/headroom-bench)
# into $1, with flash_attn_subset_setup.py as its setup.py.
unpack_flash_attn_subset() {
  local dest=$1 sdist_dir=$HOME/.cache/headroom-bench
  local sdist=$sdist_dir/flash_attn-2.8.3.tar.gz
  if [[ ! -f $sdist ]]; then
    mkdir -p "$sdist_dir"
    # The sdist's metadata step imports torch and skips CUDA only when told to.
    FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE "$torch_env/venv/bin/python" -m pip download --no-deps \
      --no-build-isolation --no-binary :all: flash-attn==2.8.3 -d "$sdist_dir" >"$work_dir/download.log" 2>&1 ||
      die "downloading the flash-attn sdist failed; see $work_dir/download.log"
  fi
  tar xzf "$sdist" -C "$dest" --strip-components=1
  cp "$script_dir/flash_attn_subset_setup.py" "$dest/setup.py"
  rm -f "$dest/setup.cfg" "$dest/pyproject.toml"
}
