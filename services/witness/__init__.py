"""The witness service (its behaviour arrives in its own issue; today it follows the log and reports health)."""
