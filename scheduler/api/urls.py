from rest_framework.routers import SimpleRouter

from scheduler.api import views

router = SimpleRouter(trailing_slash="/?")  # type: ignore[arg-type]  # optional slash
router.register("gpu-models", views.GpuModelViewSet, basename="api-gpu-model")

urlpatterns = router.urls
