#!/bin/sh
# tests/install/test_pkgconfig.sh SOURCE_DIR WORK_DIR - checks that the
# installed agentguard.pc points at the folders the library and headers are
# installed in, for CMAKE_INSTALL_LIBDIR values of one folder (lib), two
# (lib/x86_64-linux-gnu, as GNUInstallDirs picks on Debian for --prefix
# /usr) and an absolute path, with `cmake --install --prefix` choosing a
# prefix other than the configured one. By default the paths must be
# absolute and normalised (no "..": `pkg-config --cflags` gives
# -I<prefix>/include as written); with -DAG_PC_RELOCATABLE=ON they must
# still be right after the installed tree is moved.
#
# Each case configures a scratch tree (no compiling: only the pkgconfig
# install component is installed) and asks pkg-config for libdir and
# includedir. Exits 1 naming the case and both paths when one is wrong.
set -u
SRC=$1
WORK=$2
fail=0
command -v pkg-config >/dev/null 2>&1 || { echo "pkg-config not found" >&2; exit 1; }
rm -rf "$WORK"
mkdir -p "$WORK" || exit 1

check() { # case-name configure-prefix libdir-arg expected-libdir expected-includedir pcdir
  name=$1 prefix=$2 libdir=$3 want_lib=$4 want_inc=$5 pcdir=$6
  got_lib=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=libdir agentguard 2>&1) || {
    echo "FAIL $name: pkg-config cannot read $pcdir/agentguard.pc: $got_lib"; fail=1; return; }
  got_inc=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=includedir agentguard)
  # normalize: a/b/../c -> a/c (the relocatable file uses ${pcfiledir}/..)
  n_lib=$(cd "$got_lib" 2>/dev/null && pwd -P || echo "$got_lib (missing)")
  n_inc=$(cd "$got_inc" 2>/dev/null && pwd -P || echo "$got_inc (missing)")
  if [ "$n_lib" != "$want_lib" ] || [ "$n_inc" != "$want_inc" ]; then
    echo "FAIL $name (CMAKE_INSTALL_LIBDIR=$libdir, configured prefix $prefix):"
    echo "  libdir     $got_lib -> $n_lib, expected $want_lib"
    echo "  includedir $got_inc -> $n_inc, expected $want_inc"
    fail=1
  else
    echo "ok   $name: libdir $n_lib, includedir $n_inc"
  fi
}

normalised() { # case-name pcdir expected-first-cflag (jansson's may follow)
  got=$(PKG_CONFIG_PATH=$2 pkg-config --cflags-only-I agentguard | sed 's/ *$//')
  case $got in
  *..*) echo "FAIL $1: pkg-config --cflags-only-I gives '$got', with '..'"; fail=1 ;;
  "$3" | "$3 "*) echo "ok   $1: cflags $got" ;;
  *) echo "FAIL $1: pkg-config --cflags-only-I gives '$got', expected '$3' first"; fail=1 ;;
  esac
}

run() { # case-name configure-prefix libdir-arg [relocatable]
  name=$1 prefix=$2 libdir=$3 reloc=${4:-OFF}
  b=$WORK/$name-build p=$WORK/$name-prefix
  if ! cmake -S "$SRC" -B "$b" -DAG_BUILD_TESTS=OFF -DAG_BUILD_BENCH=OFF \
      -DAG_PC_RELOCATABLE="$reloc" \
      -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR="$libdir" \
      >"$WORK/$name.log" 2>&1; then
    echo "FAIL $name: cmake configure failed:"; tail -n 20 "$WORK/$name.log"; fail=1; return
  fi
  if ! cmake --install "$b" --prefix "$p" --component pkgconfig >>"$WORK/$name.log" 2>&1; then
    echo "FAIL $name: cmake --install failed:"; tail -n 20 "$WORK/$name.log"; fail=1; return
  fi
  case $libdir in
  /*) lib=$libdir ;;
  *) lib=$p/$libdir ;;
  esac
  mkdir -p "$lib" "$p/include" # the folders the real install fills
  check "$name" "$prefix" "$libdir" "$(cd "$lib" && pwd -P)" "$(cd "$p/include" && pwd -P)" "$lib/pkgconfig"
  [ "$reloc" = ON ] || normalised "$name" "$lib/pkgconfig" "-I$p/include"
  case $reloc$libdir in
  ON/*|OFF*) ;;
  *) # relocatable: move the whole tree and ask again
    mv "$p" "$p-moved"
    check "$name, moved" "$prefix" "$libdir" "$(cd "$p-moved/$libdir" && pwd -P)" \
      "$(cd "$p-moved/include" && pwd -P)" "$p-moved/$libdir/pkgconfig" ;;
  esac
}

run lib /usr/local lib
run multiarch /usr lib/x86_64-linux-gnu
run absolute /usr "$WORK/abs/lib64"
run lib-reloc /usr/local lib ON
run multiarch-reloc /usr lib/x86_64-linux-gnu ON
exit $fail
