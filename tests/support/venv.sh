# Sourced by the scripts that install a pinned PyPI tool for the tests.
# ensure_venv REQUIREMENTS VENV: a venv at VENV with REQUIREMENTS installed,
# kept while its pins match (a copy of the file inside records them).
ensure_venv() {
  local requirements="$1" venv="$2" python="${PYTHON:-python3}"
  if ! cmp -s "$requirements" "$venv/requirements.txt" 2>/dev/null; then
    rm -rf "$venv"
    "$python" -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" >&2
    cp "$requirements" "$venv/requirements.txt"
  fi
}
