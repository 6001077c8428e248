/* /docs: Swagger UI from the swagger-ui-bundle-v2 package, served by specq (no CDN). A key the /ui page
 * keeps in this tab's session storage is sent with "Try it out" requests. */
"use strict";
window.addEventListener("load", () => {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    requestInterceptor: (req) => {
      const key = sessionStorage.getItem("specq.key");
      if (key && !req.headers.Authorization) req.headers.Authorization = `Bearer ${key}`;
      return req;
    },
  });
});
