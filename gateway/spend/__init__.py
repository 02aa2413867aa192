"""Finance's view of the ledger: spend reports, budget status and SLA attainment,
served by `gateway.http.spend_api` and printed by `cascade-gateway spend`."""

from gateway.spend.budgets import budget_statuses, render_budgets
from gateway.spend.report import COLUMNS, FormatType, render, report_row, spend_report
from gateway.spend.sla import sla_report

__all__ = [
    "COLUMNS",
    "FormatType",
    "budget_statuses",
    "render",
    "render_budgets",
    "report_row",
    "sla_report",
    "spend_report",
]
