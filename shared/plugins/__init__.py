"""The plugin SDK: event-subscribing plugins that follow the log from a recorded position, with typed events,
at-least-once delivery in stream order, an idempotence helper and replay from the start. See docs/plugins.md."""

from shared.plugins.marks import Claim
from shared.plugins.sdk import Delivery, Handler, Plugin, PluginStoppedError
from shared.plugins.settings import PLUGIN_BUCKET, PluginSettings

__all__ = ["PLUGIN_BUCKET", "Claim", "Delivery", "Handler", "Plugin", "PluginSettings", "PluginStoppedError"]
