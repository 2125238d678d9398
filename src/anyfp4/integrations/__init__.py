"""Integrations with serving engines. Each submodule imports its engine; anyfp4 itself never does."""
