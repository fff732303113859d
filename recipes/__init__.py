"""Recipe YAML files (a package only so that they ship with a non-editable install)."""
