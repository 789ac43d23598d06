#!/bin/sh
# The checkout stands alone: no tracked file (build file, test, script, doc or
# comment) may point at anything outside the repository — reading notes kept
# beside a development checkout, absolute paths of one machine — and nothing
# may speak of work sessions or issue numbers instead of the project itself.
# Runs on the committed and working-tree files git tracks; outside a git
# checkout (a source tarball) there is nothing to compare and it skips (77).
cd "$1" || exit 1
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "not a git checkout: skipped"; exit 77; }
status=0
# Paths and names of material that lives outside the repository.
hits=$(git grep -n -I -E '\.\./shared|/work/(shared|main|wt)|COMPAT §|COMPAT\.md|ARCHS §|ARCHS\.md|CMF_V2_SPEC' \
  -- . ':!tests/self_contained.sh')
if [ -n "$hits" ]; then
  echo "files point outside the repository:"; echo "$hits"; status=1
fi
# Work-tracking vocabulary.
hits=$(git grep -n -I -E -i 'sessio[n] [0-9]+|issue[s]? #?[0-9]+|[(]issue' -- . ':!*.lock' ':!*package-lock.json' \
  ':!tests/self_contained.sh')
if [ -n "$hits" ]; then
  echo "files speak of work sessions or issue numbers:"; echo "$hits"; status=1
fi
[ $status = 0 ] && echo "self-contained: no references outside the checkout"
exit $status
