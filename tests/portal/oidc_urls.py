"""The URL conf with OpenID Connect on, as `config.urls` builds it when `OIDC_RP_CLIENT_ID` is set."""

from django.urls import include, path

from config.urls import urlpatterns as base

urlpatterns = [*base, path("oidc/", include("mozilla_django_oidc.urls"))]
