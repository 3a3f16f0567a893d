"""The dashboard's page (page.html, beside this module): one HTML document with its style and script and no
outside resources, so it works on a machine without internet access."""

from importlib import resources

PAGE = resources.files("gt.dashboard").joinpath("page.html").read_text(encoding="utf-8")
