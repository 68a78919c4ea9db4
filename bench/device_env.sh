# Source at the start of every device-machine command (after .payload/setup.sh):
#   source .payload/setup.sh || exit 3; source bench/device_env.sh || exit 4
# The device machine has no package index, so instead of installing we lay out
# the installed package shape (kernels/ and asm/ inside flash_attn_poly) with
# symlinks in /tmp and put that on PYTHONPATH.
_fap_root=$(pwd)
_fap_site=/tmp/fap_site
rm -rf "$_fap_site" && mkdir -p "$_fap_site/flash_attn_poly" || return 1
for _e in "$_fap_root"/flash_attn_poly/*; do ln -s "$_e" "$_fap_site/flash_attn_poly/"; done
ln -s "$_fap_root/kernels" "$_fap_site/flash_attn_poly/kernels"
ln -s "$_fap_root/asm" "$_fap_site/flash_attn_poly/asm"
export PYTHONPATH="$_fap_site:$_fap_root:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
# Without this, `python -c`/`python -m` run from the repository root put the root first on
# sys.path and import the source flash_attn_poly/, which has no kernels/ or asm/ inside.
export PYTHONSAFEPATH=1
python3 -c "import flash_attn_poly, flash_attn_poly.kernels, flash_attn_poly.asm" || return 1
# The copied tree has no .git: pass the commit in as FAP_COMMIT=<sha> before sourcing this.
echo "flash_attn_poly from $_fap_root (commit ${FAP_COMMIT:-unknown})"
