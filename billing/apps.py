from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = "Billing"

    def ready(self) -> None:
        from billing import admission, selectors
        from scheduler import admission as scheduler_admission
        from scheduler import ports

        ports.PRICE_QUOTE.register(selectors.rates_now)
        ports.SHARES_COST.register(selectors.shares_cost_per_hour)
        ports.JOB_COST.register(selectors.job_cost)
        ports.JOBS_COST.register(selectors.jobs_cost_port)
        ports.BUDGET_CAPPED.register(admission.projects_at_cap)
        ports.BUDGET_GATE.register(admission.projects_over_budget)
        ports.RESERVED_CAPACITY.register(selectors.reserved_gpus_by_project)
        scheduler_admission.ADMISSION_CHECKS.register(admission.budget_check)
