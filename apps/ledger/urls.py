from django.urls import path

from apps.ledger import views

urlpatterns = [
    path("balance", views.BalanceView.as_view(), name="balance"),
    path("ledger/entries", views.EntryListView.as_view(), name="ledger-entries"),
    path("credits/grants", views.GrantView.as_view(), name="credit-grants"),
    path("budgets", views.BudgetView.as_view(), name="budgets"),
]
