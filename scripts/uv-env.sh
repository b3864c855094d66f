# Sourced by scripts/setup.sh and scripts/lock.sh: point uv at the package indexes this machine's pip uses.
#
# uv does not read pip's configuration.  Where pip is configured with extra indexes or find-links (pip.conf,
# PIP_* variables), the same locations are passed to uv, so that `make setup` and `make lock` see exactly the
# packages pip would.  Variables the user already set for uv (UV_INDEX_URL, UV_EXTRA_INDEX_URL,
# UV_FIND_LINKS, UV_INDEX_STRATEGY) win.
_pip_cfg() {   # the value pip resolves for one key (any scope), empty when unset
    "${BOOT_PY:-python3}" -m pip config list 2>/dev/null \
        | sed -n "s/^[^.]*\.$1='\(.*\)'$/\1/p" | tr ' ' '\n' | awk 'NF && !seen[$0]++' | tr '\n' ' '
}
_idx=${PIP_INDEX_URL:-$(_pip_cfg index-url)}
_extra=${PIP_EXTRA_INDEX_URL:-$(_pip_cfg extra-index-url)}
_links=${PIP_FIND_LINKS:-$(_pip_cfg find-links)}
[ -n "${UV_INDEX_URL:-}" ] || { [ -z "${_idx// /}" ] || export UV_INDEX_URL="${_idx%% *}"; }
[ -n "${UV_EXTRA_INDEX_URL:-}" ] || { [ -z "${_extra// /}" ] || export UV_EXTRA_INDEX_URL="$(echo $_extra)"; }
[ -n "${UV_FIND_LINKS:-}" ] || { [ -z "${_links// /}" ] || export UV_FIND_LINKS="$(echo $_links | tr ' ' ',')"; }
# the CPU build of torch lies in a find-links folder or an extra index under a local version (+cpu) while the
# default index has the CUDA build of the same version: let uv pick the best match across all of them
export UV_INDEX_STRATEGY=${UV_INDEX_STRATEGY:-unsafe-best-match}
unset _idx _extra _links
