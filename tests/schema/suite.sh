#!/bin/sh
# tests/schema/suite.sh TEST_SCHEMA BUILD_DIR - the JSON Schema Test Suite's
# cases for allOf, anyOf, oneOf, not and $ref through agentguard's schema
# validator (the test suite::composition_and_ref_cases of test_schema).
# The suite comes from npm (json-schema-test-suite, pinned; its newest
# copy there is draft 4), fetched with `npm pack` into BUILD_DIR. Exits 77
# (a visible skip for CTest) without npm or the registry.
set -u
bin=$1
build=$2
version=0.0.10
dir=$build/schema-suite
if [ ! -f "$dir/package/tests/draft4/ref.json" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "SKIP: npm is needed (apt-get install npm)"
    exit 77
  fi
  mkdir -p "$dir"
  if ! (cd "$dir" && npm pack --silent "json-schema-test-suite@$version" \
    >/dev/null 2>&1 && tar xzf "json-schema-test-suite-$version.tgz"); then
    echo "SKIP: could not fetch json-schema-test-suite@$version from npm"
    exit 77
  fi
fi
AG_SCHEMA_SUITE=$dir/package/tests/draft4 exec "$bin" --filter 'suite/*' \
  --verbose
