"""Stage 3: findings become an Inventory (pandas underneath) and the files a person reads.

`inventory` holds the categories, Finding and Inventory; `writers` the md / json / csv files and
baseline diffs; `terminal` the rich summary and `dsv4-audit report`.
"""

from audit.report.inventory import CATEGORIES, SEVERITIES, Category, Finding, Inventory
from audit.report.writers import diff_markdown, load, markdown, write

__all__ = ["CATEGORIES", "SEVERITIES", "Category", "Finding", "Inventory", "diff_markdown", "load", "markdown",
           "write"]
