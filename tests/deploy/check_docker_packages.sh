#!/usr/bin/env bash
# Checks the kforge images without building them (Docker need not run here):
#
#   tests/deploy/check_docker_packages.sh BUILD_DIR [DOCKER_DIR]
#
# For every docker/Dockerfile* it reads the runtime (last) stage: the binaries it copies out of
# the build stage (COPY --from=build /build/X -> BUILD_DIR/X) and the packages its `apt-get install`
# lines install. For each binary it resolves the shared libraries with ldd, maps each to the Debian
# package that owns it (dpkg -S), and fails unless that package is
#   - a library the binary links directly (readelf NEEDED): named in the Dockerfile's install list
#     or in the base image (debian:12-slim, list below);
#   - a library those load in turn: named, in the base image, or a dependency (Depends/Pre-Depends,
#     recursively; --no-install-recommends installs nothing else) of a named package.
# It also fails on an install-list name that is not a real Debian 12 package (apt-cache show;
# NVIDIA CUDA repository packages, which this machine cannot look up, are accepted by name only in
# a Dockerfile that adds that repository), on an NVRTC package the worker would not load (it
# dlopens the libnvrtc.so.N names compiled into it), on build stages that differ between the
# Dockerfiles, on a root or non-numeric USER, and on a service image without a `kforge health`
# HEALTHCHECK or without the kforge binary that runs it.
#
# Needs a Debian 12 machine with the build's libraries installed (scripts/install-deps.sh) and apt
# lists present (apt-get update); exits 77 (skipped) when the machine cannot answer.
set -euo pipefail

SKIP=77
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [DOCKER_DIR]" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD_DIR=$(realpath -m "$1")
DOCKER_DIR=$(realpath -m "${2:-$ROOT/docker}")
# The build stage's install prefix in the Dockerfiles (BUILD_DIR=/build scripts/build.sh).
IMAGE_BUILD_DIR=/build
NVIDIA_REPO='developer.download.nvidia.com/compute/cuda/repos/debian12'

# debian:12-slim (bookworm-slim), as the official image ships it: the package list of
# https://github.com/debuerreotype/docker-debian-artifacts, bookworm/slim/rootfs.manifest.
# A library from one of these needs no apt-get install. Update it with the base image.
BASE_SLIM=(
  adduser apt base-files base-passwd bash bsdutils coreutils dash debconf debian-archive-keyring
  debianutils diffutils dpkg e2fsprogs findutils gcc-12-base gpgv grep gzip hostname
  init-system-helpers libacl1 libapt-pkg6.0 libattr1 libaudit-common libaudit1 libblkid1
  libbz2-1.0 libc-bin libc6 libcap-ng0 libcap2 libcom-err2 libcrypt1 libdb5.3 libdebconfclient0
  libext2fs2 libffi8 libgcc-s1 libgcrypt20 libgmp10 libgnutls30 libgpg-error0 libhogweed6
  libidn2-0 liblz4-1 liblzma5 libmd0 libmount1 libnettle8 libp11-kit0 libpam-modules
  libpam-modules-bin libpam-runtime libpam0g libpcre2-8-0 libseccomp2 libselinux1
  libsemanage-common libsemanage2 libsepol2 libsmartcols1 libss2 libstdc++6 libsystemd0
  libtasn1-6 libtinfo6 libudev1 libunistring2 libuuid1 libxxhash0 libzstd1 login logsave mawk
  mount ncurses-base ncurses-bin passwd perl-base sed sysvinit-utils tar tzdata usr-is-merged
  util-linux util-linux-extra zlib1g
)

skip() { echo "check_docker_packages: SKIPPED: $*"; exit $SKIP; }
if ! grep -qs '^12' /etc/debian_version; then
  skip "not a Debian 12 machine (dpkg and apt-cache must answer for the images' distribution)"
fi
for tool in ldd readelf dpkg-query apt-cache awk; do
  command -v "$tool" >/dev/null || skip "$tool is not installed"
done
apt-cache show --no-all-versions libc6 >/dev/null 2>&1 || skip "apt has no package lists (run apt-get update)"
[ -d "$BUILD_DIR" ] || { echo "check_docker_packages: no build folder $BUILD_DIR" >&2; exit 2; }

FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }

# Dockerfile -> one record per line, tab-separated, of what the checks need:
#   stage IDX NAME FROM | arg IDX NAME DEFAULT | apt IDX PKG | copyfrom IDX FROM SRC... |
#   copy IDX SRC... | user IDX VALUE | health IDX TEXT | entrypoint IDX TEXT
# IDX is the stage (0 = before the first FROM). Continuation lines are joined; comment lines are
# dropped, inside continuations too, as Docker does.
parse_dockerfile() {
  awk '
    function flush(l,   n, w, i, j, k, segs, ns, t, nt, inst, from, name, rest, srcs, a) {
      if (l !~ /[^ \t]/) return
      sub(/^[ \t]+/, "", l)
      n = split(l, w, /[ \t]+/)
      inst = toupper(w[1])
      if (inst == "FROM") {
        stage++; from = ""; name = ""
        for (i = 2; i <= n; i++) {
          if (w[i] ~ /^--/) continue
          if (from == "") from = w[i]
          else if (toupper(w[i]) == "AS" && i < n) name = w[i + 1]
        }
        printf "stage\t%d\t%s\t%s\n", stage, name, from
      } else if (inst == "ARG") {
        a = w[2]; k = index(a, "=")
        if (k > 0) printf "arg\t%d\t%s\t%s\n", stage, substr(a, 1, k - 1), substr(a, k + 1)
        else printf "arg\t%d\t%s\t\n", stage, a
      } else if (inst == "RUN") {
        rest = l; sub(/^[^ \t]+[ \t]+/, "", rest)
        ns = split(rest, segs, /&&|\|\||;|\|/)
        for (i = 1; i <= ns; i++) {
          nt = split(segs[i], t, /[ \t]+/)
          for (j = 1; j <= nt; j++) {
            if ((t[j] == "apt-get" || t[j] == "apt") && t[j + 1] == "install") {
              for (k = j + 2; k <= nt; k++) {
                if (t[k] == "" || t[k] ~ /^-/) continue
                if (t[k] ~ /^[0-9]*>/ || t[k] ~ /^</) break
                printf "apt\t%d\t%s\n", stage, t[k]
              }
              break
            }
          }
        }
      } else if (inst == "COPY" || inst == "ADD") {
        from = ""; srcs = ""; j = 0
        for (i = 2; i <= n; i++) {
          if (w[i] ~ /^--from=/) { from = substr(w[i], 8); continue }
          if (w[i] ~ /^--/) continue
          a = w[i]; j++
          if (i < n) srcs = srcs "\t" a   # the last word is the destination
        }
        if (inst == "COPY" && from != "") printf "copyfrom\t%d\t%s%s\n", stage, from, srcs
        else if (inst == "COPY") printf "copy\t%d%s\n", stage, srcs
      } else if (inst == "USER") {
        printf "user\t%d\t%s\n", stage, w[2]
      } else if (inst == "HEALTHCHECK") {
        rest = l; sub(/^[^ \t]+[ \t]+/, "", rest)
        printf "health\t%d\t%s\n", stage, rest
      } else if (inst == "ENTRYPOINT") {
        rest = l; sub(/^[^ \t]+[ \t]+/, "", rest)
        printf "entrypoint\t%d\t%s\n", stage, rest
      }
    }
    BEGIN { stage = 0; buf = "" }
    /^[ \t]*#/ { next }
    {
      line = $0
      if (line ~ /\\[ \t]*$/) { sub(/\\[ \t]*$/, "", line); buf = buf line " "; next }
      flush(buf line); buf = ""
    }
    END { flush(buf) }
  ' "$1"
}

# The Debian package that owns each library file, trying the merged-/usr spellings of its path and
# of its symlink target (ldd reports /lib/x86_64-linux-gnu/..., most bookworm packages own
# /usr/lib/..., libc6 still owns /lib/...). One dpkg-query for all of a binary's libraries.
declare -A OWNER=()      # library path -> package ("" when none owns it)
look_up_owners() {   # PATH...
  local p i line pkg path new=() reals=()
  local -A spelt=()    # spelling -> the library paths it stands for
  for p; do [ -n "${OWNER[$p]+x}" ] || new+=("$p"); done
  [ ${#new[@]} -gt 0 ] || return 0
  mapfile -t reals < <(realpath -m "${new[@]}")
  for i in "${!new[@]}"; do
    p=${new[$i]}
    OWNER[$p]=""
    for path in "$p" "${reals[$i]}"; do
      spelt[$path]+="$p "
      case "$path" in /usr/*) spelt[${path#/usr}]+="$p " ;; *) spelt[/usr$path]+="$p " ;; esac
    done
  done
  while IFS= read -r line; do
    case "$line" in "diversion by"*) continue ;; esac
    pkg=${line%%: *}; path=${line#*: }
    pkg=${pkg%%,*}; pkg=${pkg%%:*}
    for p in ${spelt[$path]:-}; do [ -n "${OWNER[$p]}" ] || OWNER[$p]=$pkg; done
  done < <(dpkg-query -S "${!spelt[@]}" 2>/dev/null || true)
}

# Which names are real Debian 12 packages: one apt-cache call for all of them (it prints the
# records it finds and skips unknown and purely virtual names).
declare -A REAL=()
look_up_packages() {   # NAME...
  local p new=()
  for p; do [ -n "${REAL[$p]+x}" ] || { new+=("$p"); REAL[$p]=0; }; done
  [ ${#new[@]} -gt 0 ] || return 0
  while read -r p; do REAL[$p]=1; done < <(apt-cache show --no-all-versions "${new[@]}" 2>/dev/null | sed -n 's/^Package: //p')
}
is_debian_package() { [ "${REAL[$1]:-0}" = 1 ]; }

# --- Every Dockerfile's build stage is the same text (what lets BuildKit share it).
shopt -s nullglob
DOCKERFILES=("$DOCKER_DIR"/Dockerfile "$DOCKER_DIR"/Dockerfile.*)
[ ${#DOCKERFILES[@]} -gt 0 ] || { echo "check_docker_packages: no Dockerfile in $DOCKER_DIR" >&2; exit 2; }
build_stage() { sed -n '/^# ---- build stage/,/^# ---- end of build stage/p' "$1"; }
REF_STAGE=$(build_stage "${DOCKERFILES[0]}")
for df in "${DOCKERFILES[@]}"; do
  stage_text=$(build_stage "$df")
  if [ -z "$stage_text" ]; then
    fail "$(basename "$df"): no '# ---- build stage' ... '# ---- end of build stage' block"
  elif [ "$stage_text" != "$REF_STAGE" ]; then
    fail "$(basename "$df"): its build stage differs from $(basename "${DOCKERFILES[0]}")'s (keep them identical:" \
         "the images share one cached build)"
  fi
done

# --- Each image's runtime stage.
for df in "${DOCKERFILES[@]}"; do
  file=$(basename "$df")
  failures_before=$FAILURES
  image=${file#Dockerfile}; image=${image#.}; image=${image:-kforge (all-in-one)}
  records=$(parse_dockerfile "$df")
  last=$(awk -F'\t' '$1 == "stage" { s = $2 } END { print s + 0 }' <<<"$records")
  if [ "$last" -lt 2 ]; then fail "$image ($file): no separate runtime stage"; continue; fi

  # ARG defaults visible in the runtime stage: global ones and the stage's own.
  declare -A ARGS=()
  while IFS=$'\t' read -r _ idx name value; do
    [ "$idx" = 0 ] || [ "$idx" = "$last" ] || continue
    ARGS[$name]=$value
  done < <(awk -F'\t' '$1 == "arg"' <<<"$records")
  expand() {
    local s=$1 n
    for n in "${!ARGS[@]}"; do s=${s//\$\{$n\}/${ARGS[$n]}}; s=${s//\$$n/${ARGS[$n]}}; done
    echo "$s"
  }

  # The runtime stage's packages, following FROM <earlier stage> back to the base image.
  declare -A LISTED=() BASE=()
  stage=$last
  while :; do
    while IFS=$'\t' read -r _ idx pkg; do
      [ "$idx" = "$stage" ] || continue
      pkg=$(expand "$pkg"); pkg=${pkg%%=*}; pkg=${pkg%%:*}
      LISTED[$pkg]=1
    done < <(awk -F'\t' '$1 == "apt"' <<<"$records")
    from=$(awk -F'\t' -v s="$stage" '$1 == "stage" && $2 == s { print $4 }' <<<"$records")
    from=$(expand "$from")
    parent=$(awk -F'\t' -v f="$from" -v s="$stage" '$1 == "stage" && $3 == f && $2 < s { print $2 }' <<<"$records" | tail -1)
    if [ -n "$parent" ]; then stage=$parent; continue; fi
    case "$from" in
      debian:12-slim|debian:bookworm-slim) for p in "${BASE_SLIM[@]}"; do BASE[$p]=1; done ;;
      *) fail "$image ($file): runtime stage is based on '$from'; this check knows the packages of debian:12-slim only" ;;
    esac
    break
  done
  stage_text=$(awk -v s="$last" '/^[ \t]*FROM[ \t]/ { n++ } n == s' "$df")
  adds_nvidia_repo=0
  grep -q "$NVIDIA_REPO" <<<"$stage_text" && adds_nvidia_repo=1

  # Real packages? (Debian's from apt-cache; NVIDIA's by name, where the repository is added.)
  look_up_packages "${!LISTED[@]}"
  DEBIAN_LISTED=()
  NVRTC_MAJORS=()
  for pkg in "${!LISTED[@]}"; do
    if is_debian_package "$pkg"; then
      DEBIAN_LISTED+=("$pkg")
    elif [ $adds_nvidia_repo = 1 ] && [[ $pkg =~ ^cuda-[a-z0-9-]+-([0-9]+)-[0-9]+$ ]]; then
      [[ $pkg == cuda-nvrtc-* ]] && NVRTC_MAJORS+=("${BASH_REMATCH[1]}")
    else
      fail "$image ($file): '$pkg' in the apt-get install list is not a Debian 12 package"
    fi
  done
  [ ${#LISTED[@]} -gt 0 ] || fail "$image ($file): the runtime stage installs no packages"

  # What the named Debian packages pull in with them.
  declare -A CLOSURE=()
  if [ ${#DEBIAN_LISTED[@]} -gt 0 ]; then
    while read -r p; do
      p=${p#<}; p=${p%>}; p=${p%%:*}
      CLOSURE[$p]=1
    done < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
               --no-replaces --no-enhances "${DEBIAN_LISTED[@]}" 2>/dev/null | grep -v '^ ')
  fi

  # The binaries the runtime stage ships.
  BINARIES=()
  while IFS=$'\t' read -r -a rec; do
    [ "${rec[1]}" = "$last" ] || continue
    if [ "${rec[2]}" != build ]; then
      fail "$image ($file): COPY --from=${rec[2]}: only files from the build stage can be checked"
      continue
    fi
    for src in "${rec[@]:3}"; do
      case "$src" in
        "$IMAGE_BUILD_DIR"/*) BINARIES+=("${src#"$IMAGE_BUILD_DIR"/}") ;;
        *) fail "$image ($file): COPY --from=build $src is outside $IMAGE_BUILD_DIR" ;;
      esac
    done
  done < <(awk -F'\t' '$1 == "copyfrom"' <<<"$records")
  [ ${#BINARIES[@]} -gt 0 ] || fail "$image ($file): the runtime stage copies no binary from the build stage"

  nlibs=0
  declare -A USED=() MISSING=()
  for rel in "${BINARIES[@]}"; do
    bin="$BUILD_DIR/$rel"
    name=$(basename "$rel")
    if [ ! -x "$bin" ]; then fail "$image ($file): $name is not built ($bin)"; continue; fi
    declare -A DIRECT=()
    while read -r soname; do DIRECT[$soname]=1; done < <(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    ldd_out=$(ldd "$bin" 2>&1) || { fail "$image ($file): ldd $name failed: $ldd_out"; continue; }
    mapfile -t lib_paths < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 }' <<<"$ldd_out")
    look_up_owners "${lib_paths[@]}"
    while read -r soname arrow path _; do
      [ "$arrow" = "=>" ] || continue            # linux-vdso and the loader's own line
      if [ "$path" = not ]; then fail "$image ($file): $name needs $soname, which is not found on this machine"; continue; fi
      nlibs=$((nlibs + 1))
      pkg=${OWNER[$path]}
      if [ -z "$pkg" ]; then
        fail "$image ($file): $name loads $soname ($path), which no Debian package owns: the image cannot install it"
        continue
      fi
      USED[$pkg]=1
      if [ -n "${LISTED[$pkg]+x}" ] || [ -n "${BASE[$pkg]+x}" ]; then continue; fi
      if [ -n "${DIRECT[$soname]+x}" ]; then MISSING["$name	$pkg	links"]+="$soname "
      elif [ -z "${CLOSURE[$pkg]+x}" ]; then MISSING["$name	$pkg	loads"]+="$soname "
      fi
    done <<<"$ldd_out"
    unset DIRECT
  done
  # One line per binary and missing package, naming its libraries.
  mapfile -t keys < <(printf '%s\n' "${!MISSING[@]}" | sort)
  for key in "${keys[@]}"; do
    [ -n "$key" ] || continue
    IFS=$'\t' read -r name pkg how <<<"$key"
    libs=${MISSING[$key]% }
    if [ "$how" = links ]; then
      fail "$image ($file): $name links ${libs// /, } from package $pkg, which the runtime stage does not" \
           "install (add $pkg to its apt-get install list)"
    else
      fail "$image ($file): $name loads ${libs// /, } from package $pkg, which neither the runtime stage's" \
           "packages nor the base image bring (add $pkg to its apt-get install list)"
    fi
  done

  # NVRTC: the worker dlopens it by the names compiled into it; the image's package must be one.
  ships_worker=0
  for rel in "${BINARIES[@]}"; do [[ $rel == */kforge-gpu-worker ]] && ships_worker=1; done
  if [ $ships_worker = 1 ] && [ $adds_nvidia_repo = 1 ]; then
    wanted=$(for rel in "${BINARIES[@]}"; do [ -f "$BUILD_DIR/$rel" ] && grep -aoE 'libnvrtc\.so\.[0-9]+' "$BUILD_DIR/$rel"; done |
             sed 's/.*\.//' | sort -u | tr '\n' ' ') || true
    if [ ${#NVRTC_MAJORS[@]} -eq 0 ]; then
      fail "$image ($file): adds NVIDIA's CUDA repository but installs no cuda-nvrtc-* package (the worker loads libnvrtc.so.{${wanted% }})"
    fi
    for m in "${NVRTC_MAJORS[@]}"; do
      [[ " $wanted " == *" $m "* ]] ||
        fail "$image ($file): installs NVRTC $m, but kforge-gpu-worker loads only libnvrtc.so.N for N in: ${wanted:-none}"
    done
  fi

  # A non-root, numeric user (runAsNonRoot), and a health check that the image can run.
  user=$(awk -F'\t' -v s="$last" '$1 == "user" && $2 == s { u = $3 } END { print u }' <<<"$records")
  uid=${user%%:*}
  if [ -z "$user" ]; then fail "$image ($file): no USER: the image would run as root"
  elif ! [[ $uid =~ ^[0-9]+$ ]] || [ "$uid" = 0 ]; then
    fail "$image ($file): USER $user: give a numeric uid other than 0 (Kubernetes' runAsNonRoot checks it)"
  fi
  health=$(awk -F'\t' -v s="$last" '$1 == "health" && $2 == s { h = $3 } END { print h }' <<<"$records")
  entry=$(awk -F'\t' -v s="$last" '$1 == "entrypoint" && $2 == s { e = $3 } END { print e }' <<<"$records")
  ships_cli=0
  for rel in "${BINARIES[@]}"; do [ "$(basename "$rel")" = kforge ] && ships_cli=1; done
  if [[ $entry =~ \"kforge\" ]]; then
    :   # the command-line image serves nothing
  elif [ -z "$health" ] || [ "$health" = NONE ]; then
    fail "$image ($file): a service image without a HEALTHCHECK"
  elif ! [[ $health =~ \"kforge\",\ *\"health\" ]]; then
    fail "$image ($file): HEALTHCHECK should run [\"kforge\", \"health\", ...]: $health"
  elif [ $ships_cli = 0 ]; then
    fail "$image ($file): HEALTHCHECK runs kforge, which the image does not ship"
  fi
  # Files from the build context exist.
  while IFS=$'\t' read -r -a rec; do
    [ "${rec[1]}" = "$last" ] || continue
    for src in "${rec[@]:2}"; do
      compgen -G "$ROOT/$src" >/dev/null || fail "$image ($file): COPY $src: no such file in the repository"
    done
  done < <(awk -F'\t' '$1 == "copy"' <<<"$records")

  note=""
  [ $adds_nvidia_repo = 1 ] && note=" (NVRTC ${NVRTC_MAJORS[*]:-none} from NVIDIA's CUDA repository; libcuda.so.1 from the host driver)"
  verdict=ok
  [ $FAILURES = "$failures_before" ] || verdict="$((FAILURES - failures_before)) problem(s) above"
  echo "$image ($file): ${#BINARIES[@]} binaries load $nlibs libraries from ${#USED[@]} packages;" \
       "the runtime stage installs ${#LISTED[@]}$note: $verdict"
  unset ARGS LISTED BASE CLOSURE USED MISSING
done

if [ $FAILURES -gt 0 ]; then
  echo "check_docker_packages: $FAILURES problem(s)"
  exit 1
fi
echo "check_docker_packages: ok"
