"""The installed agentrl-core's version.

Every package of the repository takes its version from the root ``VERSION`` file at build
time; at run time the installed distribution's metadata is the one answer (an editable
install reports the version it was installed with).
"""

from importlib import metadata

try:
    __version__ = metadata.version("agentrl-core")
except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
