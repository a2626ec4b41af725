#!/bin/sh
# Prints the Debian package of the clang runtime (libFuzzer and the
# sanitizers' runtimes) that matches the installed clang: libclang-rt-N-dev
# for clang N. Without clang, the one Debian's clang package would bring.
major=$(clang --version 2>/dev/null | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
if [ -z "$major" ]; then
  major=$(apt-cache depends clang 2>/dev/null | sed -n 's/.*Depends: clang-\([0-9]*\)$/\1/p' | head -1)
fi
echo "libclang-rt-${major:-14}-dev"
