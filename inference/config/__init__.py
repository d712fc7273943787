"""renq's live configuration: what `fixtures/config.yaml` loads besides services and backends,
and how running processes notice a change.

    from inference.config.changes import config_changed_since, config_last_update, ConfigWatcher
    from inference.config.tiers import tier_policies, tier_policy   # aging, weight, target
    from inference.config.tiers import current_tier_policies       # the same, cached

`inference.config.file` reads, validates and dumps the whole file (`manage.py renq_config`).
"""
