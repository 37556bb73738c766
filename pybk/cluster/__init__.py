"""The backend-agnostic cluster controller: plan(spec, observed) -> actions."""
