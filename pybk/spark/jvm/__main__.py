"""`python -m pybk.spark.jvm`: build pybk's Spark jar (if its sources changed) and print its path."""
import sys

from . import JarBuildError, build

try:
    print(build())
except JarBuildError as exc:
    print(f"pybk spark jar: {exc}", file=sys.stderr)
    sys.exit(1)
