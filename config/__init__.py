"""The pipeline's one typed config: its sections (sections.py), the presets as data files
(presets/*.toml, presets.py), options by dotted name (overrides.py), their checks
(validation.py), a run's config resolved once (resolution.py), and a stage's view of it
(stage_view.py)."""
