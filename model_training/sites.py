"""Which site a URL belongs to: one notion for the data sampling, the held-out split and evaluation.

A site is the registrable domain of the URL's host (`news.bbc.co.uk` -> `bbc.co.uk`,
`de.creativecommons.org` -> `creativecommons.org`), looking through web.archive.org captures to the page
they archive. On hosting platforms that give every customer a subdomain (`*.wordpress.com`,
`*.blogspot.com`, `*.github.io`, ...) the subdomain is the site: two blogs share a platform, not a
template author or an owner. No public-suffix-list dependency: the short lists below cover the corpora
we train on, and a missed suffix only merges or splits a few sites.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

# Second-level labels under which a country-code TLD registers names (example.co.uk, example.com.au).
_CCTLD_SECOND_LEVEL = frozenset({"ac", "co", "com", "edu", "gob", "gov", "govt", "net", "org", "or", "ne"})
# Platforms whose subdomains belong to different owners (private entries of the public suffix list).
_SHARED_HOSTS = frozenset(
    {
        "blogspot.com",
        "github.io",
        "gitlab.io",
        "herokuapp.com",
        "livejournal.com",
        "medium.com",
        "neocities.org",
        "netlify.app",
        "pages.dev",
        "substack.com",
        "tumblr.com",
        "vercel.app",
        "weebly.com",
        "wixsite.com",
        "wordpress.com",
    }
)
_ARCHIVE_PATH = re.compile(r"^/web/[^/]+/(?P<inner>.+)$")


def site_of(url: str | None) -> str | None:
    """The site a URL belongs to (see the module docstring); None without a usable host."""
    while True:  # a loop, not recursion: a capture of a capture of ... is still one URL
        if not url:
            return None
        try:
            parts = urlsplit(url)
            host = parts.hostname
        except ValueError:
            return None
        if not host:
            return None
        host = host.rstrip(".").lower()
        match = _ARCHIVE_PATH.match(parts.path) if host == "web.archive.org" else None
        if match is None:
            break
        inner = match["inner"]
        url = inner if "://" in inner else "http://" + inner
    try:
        return str(ipaddress.ip_address(host))  # an address is its own site, not "0.1" of 10.0.0.1
    except ValueError:
        pass
    labels = host.split(".")
    for size in (2, 3):  # a shared host's customer subdomain is the site (`blog.wordpress.com`)
        if len(labels) > size and ".".join(labels[-size:]) in _SHARED_HOSTS:
            return ".".join(labels[-size - 1 :])
    if len(labels) >= 3 and len(labels[-1]) == 2 and labels[-2] in _CCTLD_SECOND_LEVEL:
        return ".".join(labels[-3:])
    return ".".join(labels[-2:])
