"""spark-submit entry point of the telemetry job (docs/analytics.md); takes the flags of
`gateway analytics telemetry`:

    spark-submit --master spark://host:7077 --py-files analytics.zip \\
        analytics/submit.py telemetry --topic devices --gateway http://gw:8082 --out /shared/out
"""

import sys

from analytics.cli import entry

if __name__ == "__main__":
    sys.exit(entry())
