#!/usr/bin/env bash
# The tracked tree holds plain files only: no symbolic link (git stores one as mode 120000; a clone makes it a link that
# the project's readers and writers would follow), and no file that .gitignore ignores (a file force-added under runs/
# or data/ is checked out by every clone, where the project treats it as its own). Exit 1 naming each one.
set -euo pipefail
cd "${1:-.}"
links=$(git ls-files -s -z | tr '\0' '\n' | awk -F '\t' '$1 ~ /^120000 / {print $2}')
ignored=$(git ls-files -ci --exclude-standard)
status=0
if [ -n "$links" ]; then
  printf 'error: symbolic link in the tracked tree (valid: plain files only): %s\n' $links >&2
  status=1
fi
if [ -n "$ignored" ]; then
  printf 'error: tracked file that .gitignore ignores (valid: none; git rm --cached it): %s\n' $ignored >&2
  status=1
fi
exit $status
